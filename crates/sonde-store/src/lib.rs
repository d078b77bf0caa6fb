//! sonde's results database: every test's result, kept in one SQLite file so that runs can be
//! listed, compared and drawn later.
//!
//! What a run keeps: the whole result document exactly as `--json` printed it; indexed columns
//! to find it by (time, test, protocol, server, labels, group) and its headline figures; and for
//! a latency run the full HDR histogram of its round-trip times in hdrhistogram's compact V2
//! serialized form, so that a distribution can be drawn and repetitions merged exactly.
//!
//! No rendering and no sockets: the caller hands in the document as text and the figures it
//! wants indexed, and gets them back. The file is SQLite's own format (`rusqlite` with its
//! bundled SQLite), written in WAL mode with a busy timeout so that two sonde processes saving
//! at the same moment both land. The schema is versioned (`PRAGMA user_version`, migrated
//! forward on open) and marked as sonde's (`PRAGMA application_id`): a file that is not sonde's
//! database, or is corrupt, is reported with its path and never written.
//!
//! ```
//! use sonde_store::{Filter, Headline, Label, NewRun, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let mut store = Store::open(&dir.path().join("results.db"))?;
//! let labels: Vec<Label> = vec!["path=private".parse()?];
//! let id = store.insert(&NewRun {
//!     time_unix_ms: 1_764_000_000_000,
//!     test: "latency",
//!     protocol: Some("tcp"),
//!     server: Some("198.18.0.2:5300"),
//!     labels: &labels,
//!     headline: Headline { rtt_p50_ns: Some(41_000), ..Headline::default() },
//!     document: r#"{"test":"latency"}"#,
//!     ..NewRun::default()
//! })?;
//! let runs = store.runs(&Filter { labels: labels.clone(), ..Filter::default() })?;
//! assert_eq!(runs[0].id, id);
//! assert_eq!(runs[0].headline.rtt_p50_ns, Some(41_000));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rusqlite::{params, params_from_iter, Connection, ErrorCode, OptionalExtension};

/// The schema version this sonde writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: u32 = 4;

/// Marks the file as sonde's (`PRAGMA application_id`): "SNDE".
pub const APPLICATION_ID: i32 = 0x534E_4445;

/// The histogram name of a latency run's round-trip times.
pub const HISTOGRAM_RTT: &str = "rtt";
/// `sonde load`: the round-trip times on the idle path.
pub const HISTOGRAM_IDLE_RTT: &str = "idle_rtt";
/// `sonde load`: the round-trip times while the load ran.
pub const HISTOGRAM_LOADED_RTT: &str = "loaded_rtt";

/// How long a writer waits for another process's write to finish before giving up. Saving a run
/// takes milliseconds; this only has to outlast another sonde's save.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The first 16 bytes of every SQLite 3 database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The migrations, in order: entry `n` takes the schema from version `n` to `n + 1`. Never edit
/// one that has been released; add the next.
const MIGRATIONS: &[&str] = &[
    // 1: runs, their labels and histograms.
    "CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        time_unix_ms INTEGER NOT NULL,
        test TEXT NOT NULL,
        protocol TEXT,
        server TEXT,
        rtt_mean_ns REAL,
        rtt_p50_ns INTEGER,
        rtt_p99_ns INTEGER,
        rtt_p9999_ns INTEGER,
        bits_per_second REAL,
        packets_per_second REAL,
        connections_per_second REAL,
        loss_percent REAL,
        document TEXT NOT NULL
    );
    CREATE INDEX runs_time ON runs (time_unix_ms);
    CREATE INDEX runs_test ON runs (test, time_unix_ms);
    CREATE TABLE labels (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (run_id, key)
    ) WITHOUT ROWID;
    CREATE INDEX labels_key_value ON labels (key, value);
    CREATE TABLE histograms (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        encoding TEXT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (run_id, name)
    ) WITHOUT ROWID;",
    // 2: groups (`--repeat`, the cases of `quick`, the steps of a sweep) and interrupted runs.
    "CREATE TABLE groups (
        id INTEGER PRIMARY KEY,
        created_unix_ms INTEGER NOT NULL,
        kind TEXT NOT NULL
    );
    ALTER TABLE runs ADD COLUMN group_id INTEGER REFERENCES groups (id);
    ALTER TABLE runs ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_group ON runs (group_id);",
    // 3: the cases of a group that did not run (a plan's unreachable or refusing endpoint).
    "CREATE TABLE failures (
        id INTEGER PRIMARY KEY,
        group_id INTEGER NOT NULL REFERENCES groups (id),
        time_unix_ms INTEGER NOT NULL,
        test TEXT NOT NULL,
        reason TEXT NOT NULL,
        exit_code INTEGER NOT NULL
    );
    CREATE INDEX failures_group ON failures (group_id);
    CREATE TABLE failure_labels (
        failure_id INTEGER NOT NULL REFERENCES failures (id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (failure_id, key)
    ) WITHOUT ROWID;",
    // 4: a plan run keeps its plan (the file as given and its text), so `--resume` needs no
    // file and refuses one that changed.
    "ALTER TABLE groups ADD COLUMN plan_file TEXT;
    ALTER TABLE groups ADD COLUMN plan_text TEXT;",
];

/// What went wrong, with the database's path where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file exists but is not an SQLite database. It is left untouched.
    #[error("{}: not a sonde results database (not an SQLite file); left untouched, choose another path with --db or SONDE_DB", .path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },
    /// An SQLite database of another program.
    #[error("{}: an SQLite database that is not sonde's; left untouched, choose another path with --db or SONDE_DB", .path.display())]
    Foreign {
        /// The file.
        path: PathBuf,
    },
    /// The database is damaged. It is left untouched.
    #[error("{}: the database is corrupt ({source}); left untouched, move it away to start a new one", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// Written by a newer sonde, whose schema this one does not know.
    #[error("{}: written by a newer sonde (schema version {found}; this one knows up to {known})", .path.display())]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: u32,
        /// The newest this build knows.
        known: u32,
    },
    /// No database at the path (a reader does not create one).
    #[error("{}: no results stored yet (no database there)", .path.display())]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// The database, or its directory, cannot be written.
    #[error("{}: the database cannot be written: read-only file or directory? ({source})", .path.display())]
    ReadOnly {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The disk (or the database's size limit) is full.
    #[error("{}: the disk is full ({source})", .path.display())]
    Full {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// Another process held the database locked for longer than the busy timeout.
    #[error("{}: the database stayed locked by another process ({source})", .path.display())]
    Busy {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The database's directory could not be created.
    #[error("{}: cannot create the directory: {source}", .path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file could not be read to check what it is.
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Any other SQLite failure.
    #[error("{}: {source}", .path.display())]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// A label that is not `KEY=VALUE`.
    #[error("label {0:?}: expected KEY=VALUE, KEY made of letters, digits, '_', '-' and '.'")]
    BadLabel(String),
    /// The same label key twice on one run.
    #[error("label {0:?} given twice")]
    DuplicateLabel(String),
    /// A stored histogram that does not decode.
    #[error("run {run} histogram {name:?}: {message}")]
    Histogram {
        /// The run.
        run: RunId,
        /// The histogram's name.
        name: String,
        /// What the decoder said.
        message: String,
    },
}

impl Error {
    /// Maps an SQLite error to the kind a user can act on.
    fn sqlite(path: &Path, source: rusqlite::Error) -> Self {
        let path = path.to_owned();
        match source.sqlite_error_code() {
            Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
                Self::ReadOnly { path, source }
            }
            Some(ErrorCode::DiskFull) => Self::Full { path, source },
            Some(ErrorCode::NotADatabase) => Self::NotADatabase { path },
            Some(ErrorCode::DatabaseCorrupt) => Self::Corrupt { path, source },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                Self::Busy { path, source }
            }
            _ => Self::Sqlite { path, source },
        }
    }
}

/// A stored run's id (SQLite's rowid: never reused while a newer run exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub i64);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for RunId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(RunId)
    }
}

/// A group of runs made by one command: the repetitions of `--repeat`, the cases of `quick`,
/// the steps of a `--sweep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub i64);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for GroupId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(GroupId)
    }
}

/// `KEY=VALUE`: names the case a run measured (`path=private`, `zone=other`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    /// Letters, digits, `_`, `-`, `.`; not empty.
    pub key: String,
    /// Anything, `=` included; may be empty.
    pub value: String,
}

impl Label {
    /// A label from its parts, checking the key.
    pub fn new(key: &str, value: &str) -> Result<Self, Error> {
        let ok = !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if ok {
            Ok(Self {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        } else {
            Err(Error::BadLabel(format!("{key}={value}")))
        }
    }
}

impl FromStr for Label {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let (key, value) = s.split_once('=').ok_or_else(|| Error::BadLabel(s.into()))?;
        Self::new(key, value)
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// The figures a run is listed and compared by; `None` where the test has no such figure (or
/// could not measure it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Headline {
    /// Mean round-trip time, ns.
    pub rtt_mean_ns: Option<f64>,
    /// Median round-trip time, ns.
    pub rtt_p50_ns: Option<u64>,
    /// 99th percentile round-trip time, ns.
    pub rtt_p99_ns: Option<u64>,
    /// 99.99th percentile round-trip time, ns (`None` when the samples cannot support it).
    pub rtt_p9999_ns: Option<u64>,
    /// Throughput counted at the receiver, bits per second.
    pub bits_per_second: Option<f64>,
    /// Packets per second received.
    pub packets_per_second: Option<f64>,
    /// Connections (transactions) per second.
    pub connections_per_second: Option<f64>,
    /// Loss, percent of sent.
    pub loss_percent: Option<f64>,
}

/// How a histogram's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistogramEncoding {
    /// hdrhistogram's V2 serialization.
    HdrV2,
    /// hdrhistogram's V2 serialization, deflated (`V2DeflateSerializer`).
    HdrV2Deflate,
}

impl HistogramEncoding {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HdrV2 => "hdr-v2",
            Self::HdrV2Deflate => "hdr-v2-deflate",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "hdr-v2" => Some(Self::HdrV2),
            "hdr-v2-deflate" => Some(Self::HdrV2Deflate),
            _ => None,
        }
    }
}

/// A histogram to store with a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// What it holds: [`HISTOGRAM_RTT`] for a latency run, [`HISTOGRAM_IDLE_RTT`] and
    /// [`HISTOGRAM_LOADED_RTT`] for `load`.
    pub name: String,
    /// How `data` is encoded.
    pub encoding: HistogramEncoding,
    /// The serialized histogram.
    pub data: Vec<u8>,
}

impl Histogram {
    /// Serializes `hist` (V2, deflated) under `name`.
    pub fn encode(name: &str, hist: &hdrhistogram::Histogram<u64>) -> Self {
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        let mut data = Vec::new();
        // Writing to a Vec cannot fail for I/O; the serializer fails only on histograms it
        // cannot represent, which a u64 histogram is not.
        let (encoding, data) = match V2DeflateSerializer::new().serialize(hist, &mut data) {
            Ok(_) => (HistogramEncoding::HdrV2Deflate, data),
            Err(_) => {
                let mut plain = Vec::new();
                let _ =
                    hdrhistogram::serialization::V2Serializer::new().serialize(hist, &mut plain);
                (HistogramEncoding::HdrV2, plain)
            }
        };
        Self {
            name: name.to_owned(),
            encoding,
            data,
        }
    }

    /// Decodes the histogram (either encoding).
    pub fn decode(&self) -> Result<hdrhistogram::Histogram<u64>, String> {
        hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut self.data.as_slice())
            .map_err(|e| format!("{e:?}"))
    }
}

/// A run to save.
#[derive(Debug, Clone, Default)]
pub struct NewRun<'a> {
    /// When the test started, ms since the Unix epoch (the document's `timestamp_unix_ms`).
    pub time_unix_ms: u64,
    /// The test: `latency`, `throughput`, `pps`, `crr`, `load`.
    pub test: &'a str,
    /// `tcp` or `udp`.
    pub protocol: Option<&'a str>,
    /// The server as the client reached it.
    pub server: Option<&'a str>,
    /// The case's labels (keys distinct).
    pub labels: &'a [Label],
    /// The group it belongs to, if any.
    pub group: Option<GroupId>,
    /// Stopped before its time (Ctrl-C, SIGTERM): what it measured until then.
    pub interrupted: bool,
    /// Its headline figures.
    pub headline: Headline,
    /// The result document, exactly as `--json` prints it.
    pub document: &'a str,
    /// Its histograms (names distinct).
    pub histograms: &'a [Histogram],
}

/// A stored run as listed: everything but the document and histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Its id.
    pub id: RunId,
    /// When the test started, ms since the Unix epoch.
    pub time_unix_ms: u64,
    /// The test.
    pub test: String,
    /// `tcp` or `udp`.
    pub protocol: Option<String>,
    /// The server.
    pub server: Option<String>,
    /// Labels, sorted by key.
    pub labels: Vec<Label>,
    /// Its group.
    pub group: Option<GroupId>,
    /// Stopped before its time.
    pub interrupted: bool,
    /// Headline figures.
    pub headline: Headline,
}

/// A stored run with its document.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    /// What the listing shows.
    pub summary: RunSummary,
    /// The result document, exactly as `--json` printed it.
    pub document: String,
}

/// A group as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its id.
    pub id: GroupId,
    /// When it was made, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// What made it: `repeat`, `quick`, `sweep`, `plan`.
    pub kind: String,
    /// A plan run's plan, as it was run (none for other groups and for plan runs saved before
    /// schema version 4).
    pub plan: Option<GroupPlan>,
}

/// The plan a plan run ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    /// The plan file's path as it was given.
    pub file: String,
    /// The file's text.
    pub text: String,
}

/// A case of a group that ran no test: why, as the user saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The group it belongs to (a plan run).
    pub group: GroupId,
    /// When it was tried, ms since the Unix epoch.
    pub time_unix_ms: u64,
    /// The test it would have run.
    pub test: String,
    /// Its labels (the case), sorted by key.
    pub labels: Vec<Label>,
    /// The error, as printed.
    pub reason: String,
    /// The exit code the test alone would have ended with (3 unreachable, 4 refused, ...).
    pub exit_code: u8,
}

/// Which runs to list. Every condition given must hold; build it with `..Filter::default()`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// Only these runs (any of them); empty: no condition.
    pub ids: Vec<RunId>,
    /// Only this test.
    pub test: Option<String>,
    /// Only runs carrying every one of these labels.
    pub labels: Vec<Label>,
    /// Only runs started at or after this time, ms since the Unix epoch.
    pub since_unix_ms: Option<u64>,
    /// Only this group.
    pub group: Option<GroupId>,
    /// Only the newest N of those that match.
    pub last: Option<u64>,
}

/// The results database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// The default database path: `$XDG_DATA_HOME/sonde/results.db` on Linux
/// (`~/.local/share/sonde/results.db`), the platform's data directory elsewhere. `None` when
/// the platform has no such directory (no home).
pub fn default_path() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("sonde").join("results.db"))
}

impl Store {
    /// Opens the database at `path` for reading and writing, creating it (and its directory)
    /// when there is none, and migrating an older schema forward. A file that is not sonde's
    /// database is reported and left untouched.
    pub fn open(path: &Path) -> Result<Self, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        Self::open_at(path)
    }

    /// Opens an existing database; [`Error::Missing`] when there is none (a reader does not
    /// create one).
    pub fn open_existing(path: &Path) -> Result<Self, Error> {
        if !path.exists() {
            return Err(Error::Missing {
                path: path.to_owned(),
            });
        }
        Self::open_at(path)
    }

    fn open_at(path: &Path) -> Result<Self, Error> {
        check_header(path)?;
        let err = |e| Error::sqlite(path, e);
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
        let mut store = Self {
            conn,
            path: path.to_owned(),
        };
        store.prepare()?;
        Ok(store)
    }

    /// Where the database is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<u32, Error> {
        self.conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    fn err(&self, e: rusqlite::Error) -> Error {
        Error::sqlite(&self.path, e)
    }

    /// Checks whose file it is, turns on WAL and foreign keys, and migrates.
    fn prepare(&mut self) -> Result<(), Error> {
        let (app_id, version, objects) = self.identify()?;
        if app_id != APPLICATION_ID && (app_id != 0 || objects != 0) {
            return Err(Error::Foreign {
                path: self.path.clone(),
            });
        }
        if version > SCHEMA_VERSION {
            return Err(Error::TooNew {
                path: self.path.clone(),
                found: version,
                known: SCHEMA_VERSION,
            });
        }
        self.conn
            .pragma_update(None, "foreign_keys", true)
            .map_err(|e| self.err(e))?;
        if version < SCHEMA_VERSION {
            self.migrate(SCHEMA_VERSION)?;
        }
        // WAL lets readers and one writer work at once, and a second writer waits (busy
        // timeout) instead of failing. A read-only database keeps whatever mode it has: it can
        // still be read, and a write says why it failed.
        match self
            .conn
            .pragma_update_and_check(None, "journal_mode", "wal", |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))
        {
            Ok(_) | Err(Error::ReadOnly { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// (application_id, user_version, number of schema objects), read in one read transaction:
    /// three separate reads could straddle another opener's migration of a new database and
    /// see its tables but not yet its application id, which reads as a foreign database.
    fn identify(&self) -> Result<(i32, u32, i64), Error> {
        let err = |e| self.err(e);
        let tx = self.conn.unchecked_transaction().map_err(err)?;
        let app_id: i32 = tx
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(err)?;
        let version: u32 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        let objects: i64 = tx
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(err)?;
        // Nothing was written: ending it is only letting go of the read.
        tx.rollback().map_err(err)?;
        Ok((app_id, version, objects))
    }

    /// Applies the migrations up to `target`, in one transaction that first takes the write
    /// lock, so that two processes opening a new database at once migrate it once.
    fn migrate(&mut self, target: u32) -> Result<(), Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        // Read again under the lock: another process may have migrated meanwhile.
        let app_id: i32 = tx
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(err)?;
        let version: u32 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if app_id != APPLICATION_ID {
            let objects: i64 = tx
                .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(err)?;
            if app_id != 0 || objects != 0 {
                return Err(Error::Foreign { path });
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(err)?;
        }
        for (n, sql) in MIGRATIONS.iter().enumerate().take(target as usize) {
            if n as u32 >= version {
                tx.execute_batch(sql).map_err(err)?;
            }
        }
        if target > version {
            tx.pragma_update(None, "user_version", target)
                .map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// Starts a group (`kind`: `repeat`, `quick`, `sweep`) made at `created_unix_ms`.
    pub fn new_group(&mut self, kind: &str, created_unix_ms: u64) -> Result<GroupId, Error> {
        self.conn
            .execute(
                "INSERT INTO groups (created_unix_ms, kind) VALUES (?1, ?2)",
                params![to_i64(created_unix_ms), kind],
            )
            .map_err(|e| self.err(e))?;
        Ok(GroupId(self.conn.last_insert_rowid()))
    }

    /// Starts a plan run (a group of kind `plan`) made at `created_unix_ms`, keeping its plan.
    pub fn new_plan_group(
        &mut self,
        plan: &GroupPlan,
        created_unix_ms: u64,
    ) -> Result<GroupId, Error> {
        self.conn
            .execute(
                "INSERT INTO groups (created_unix_ms, kind, plan_file, plan_text)
                 VALUES (?1, 'plan', ?2, ?3)",
                params![to_i64(created_unix_ms), plan.file, plan.text],
            )
            .map_err(|e| self.err(e))?;
        Ok(GroupId(self.conn.last_insert_rowid()))
    }

    /// The group, if it exists.
    pub fn group(&self, id: GroupId) -> Result<Option<Group>, Error> {
        self.conn
            .query_row(
                "SELECT id, created_unix_ms, kind, plan_file, plan_text FROM groups WHERE id = ?1",
                [id.0],
                |r| {
                    let file: Option<String> = r.get(3)?;
                    let text: Option<String> = r.get(4)?;
                    Ok(Group {
                        id: GroupId(r.get(0)?),
                        created_unix_ms: to_u64(r.get(1)?),
                        kind: r.get(2)?,
                        plan: file.zip(text).map(|(file, text)| GroupPlan { file, text }),
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Saves a run with its labels and histograms, all or nothing.
    pub fn insert(&mut self, run: &NewRun<'_>) -> Result<RunId, Error> {
        for (i, l) in run.labels.iter().enumerate() {
            if run.labels[..i].iter().any(|o| o.key == l.key) {
                return Err(Error::DuplicateLabel(l.key.clone()));
            }
        }
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let h = &run.headline;
        tx.execute(
            "INSERT INTO runs (time_unix_ms, test, protocol, server, group_id, interrupted,
                rtt_mean_ns, rtt_p50_ns, rtt_p99_ns, rtt_p9999_ns, bits_per_second,
                packets_per_second, connections_per_second, loss_percent, document)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
            params![
                to_i64(run.time_unix_ms),
                run.test,
                run.protocol,
                run.server,
                run.group.map(|g| g.0),
                run.interrupted,
                h.rtt_mean_ns,
                h.rtt_p50_ns.map(to_i64),
                h.rtt_p99_ns.map(to_i64),
                h.rtt_p9999_ns.map(to_i64),
                h.bits_per_second,
                h.packets_per_second,
                h.connections_per_second,
                h.loss_percent,
                run.document,
            ],
        )
        .map_err(err)?;
        let id = tx.last_insert_rowid();
        for l in run.labels {
            tx.execute(
                "INSERT INTO labels (run_id, key, value) VALUES (?1, ?2, ?3)",
                params![id, l.key, l.value],
            )
            .map_err(err)?;
        }
        for hist in run.histograms {
            tx.execute(
                "INSERT INTO histograms (run_id, name, encoding, data) VALUES (?1, ?2, ?3, ?4)",
                params![id, hist.name, hist.encoding.as_str(), hist.data],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(RunId(id))
    }

    /// Records a case that ran no test, with its labels.
    pub fn insert_failure(&mut self, failure: &Failure) -> Result<(), Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(
            "INSERT INTO failures (group_id, time_unix_ms, test, reason, exit_code)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                failure.group.0,
                to_i64(failure.time_unix_ms),
                failure.test,
                failure.reason,
                failure.exit_code
            ],
        )
        .map_err(err)?;
        let id = tx.last_insert_rowid();
        for l in &failure.labels {
            tx.execute(
                "INSERT INTO failure_labels (failure_id, key, value) VALUES (?1, ?2, ?3)",
                params![id, l.key, l.value],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// The failures recorded in a group, oldest first.
    pub fn failures(&self, group: GroupId) -> Result<Vec<Failure>, Error> {
        let err = |e| self.err(e);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, time_unix_ms, test, reason, exit_code FROM failures
                 WHERE group_id = ?1 ORDER BY id",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([group.0], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    to_u64(r.get(1)?),
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, u8>(4)?,
                ))
            })
            .map_err(err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let mut labels = self
            .conn
            .prepare("SELECT key, value FROM failure_labels WHERE failure_id = ?1 ORDER BY key")
            .map_err(err)?;
        let mut out = Vec::with_capacity(rows.len());
        for (id, time_unix_ms, test, reason, exit_code) in rows {
            let labels = labels
                .query_map([id], |r| {
                    Ok(Label {
                        key: r.get(0)?,
                        value: r.get(1)?,
                    })
                })
                .map_err(err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            out.push(Failure {
                group,
                time_unix_ms,
                test,
                labels,
                reason,
                exit_code,
            });
        }
        Ok(out)
    }

    /// The runs that match, newest first (by start time, then id).
    pub fn runs(&self, filter: &Filter) -> Result<Vec<RunSummary>, Error> {
        let mut sql = String::from(
            "SELECT id, time_unix_ms, test, protocol, server, group_id, interrupted,
                rtt_mean_ns, rtt_p50_ns, rtt_p99_ns, rtt_p9999_ns, bits_per_second,
                packets_per_second, connections_per_second, loss_percent
             FROM runs WHERE 1",
        );
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if !filter.ids.is_empty() {
            sql.push_str(" AND id IN (");
            for (i, id) in filter.ids.iter().enumerate() {
                sql.push_str(if i == 0 { "?" } else { ", ?" });
                args.push(id.0.into());
            }
            sql.push(')');
        }
        if let Some(test) = &filter.test {
            sql.push_str(" AND test = ?");
            args.push(test.clone().into());
        }
        for l in &filter.labels {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM labels WHERE run_id = runs.id AND key = ? AND value = ?)",
            );
            args.push(l.key.clone().into());
            args.push(l.value.clone().into());
        }
        if let Some(since) = filter.since_unix_ms {
            sql.push_str(" AND time_unix_ms >= ?");
            args.push(to_i64(since).into());
        }
        if let Some(g) = filter.group {
            sql.push_str(" AND group_id = ?");
            args.push(g.0.into());
        }
        sql.push_str(" ORDER BY time_unix_ms DESC, id DESC");
        if let Some(n) = filter.last {
            sql.push_str(" LIMIT ?");
            args.push(to_i64(n).into());
        }
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok(RunSummary {
                    id: RunId(r.get(0)?),
                    time_unix_ms: to_u64(r.get(1)?),
                    test: r.get(2)?,
                    protocol: r.get(3)?,
                    server: r.get(4)?,
                    group: r.get::<_, Option<i64>>(5)?.map(GroupId),
                    interrupted: r.get(6)?,
                    labels: Vec::new(),
                    headline: Headline {
                        rtt_mean_ns: r.get(7)?,
                        rtt_p50_ns: r.get::<_, Option<i64>>(8)?.map(to_u64),
                        rtt_p99_ns: r.get::<_, Option<i64>>(9)?.map(to_u64),
                        rtt_p9999_ns: r.get::<_, Option<i64>>(10)?.map(to_u64),
                        bits_per_second: r.get(11)?,
                        packets_per_second: r.get(12)?,
                        connections_per_second: r.get(13)?,
                        loss_percent: r.get(14)?,
                    },
                })
            })
            .map_err(|e| self.err(e))?;
        let mut runs = rows
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        for run in &mut runs {
            run.labels = self.labels(run.id)?;
        }
        Ok(runs)
    }

    /// A run's labels, sorted by key.
    pub fn labels(&self, id: RunId) -> Result<Vec<Label>, Error> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key, value FROM labels WHERE run_id = ?1 ORDER BY key")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([id.0], |r| {
                Ok(Label {
                    key: r.get(0)?,
                    value: r.get(1)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// One run with its document; `None` when there is no such run.
    pub fn run(&self, id: RunId) -> Result<Option<StoredRun>, Error> {
        let summary = self.runs(&Filter {
            ids: vec![id],
            ..Filter::default()
        })?;
        let Some(summary) = summary.into_iter().next() else {
            return Ok(None);
        };
        let document = self.document(id)?.unwrap_or_default();
        Ok(Some(StoredRun { summary, document }))
    }

    /// The runs that match with their documents, newest first.
    pub fn documents(&self, filter: &Filter) -> Result<Vec<StoredRun>, Error> {
        self.runs(filter)?
            .into_iter()
            .map(|summary| {
                let document = self.document(summary.id)?.unwrap_or_default();
                Ok(StoredRun { summary, document })
            })
            .collect()
    }

    /// A run's document, exactly as `--json` printed it.
    pub fn document(&self, id: RunId) -> Result<Option<String>, Error> {
        self.conn
            .query_row("SELECT document FROM runs WHERE id = ?1", [id.0], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))
    }

    /// A run's histograms, by name.
    pub fn histograms(&self, id: RunId) -> Result<Vec<Histogram>, Error> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT name, encoding, data FROM histograms WHERE run_id = ?1 ORDER BY name",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([id.0], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (name, encoding, data) = row.map_err(|e| self.err(e))?;
            let encoding = HistogramEncoding::parse(&encoding).ok_or_else(|| Error::Histogram {
                run: id,
                name: name.clone(),
                message: format!("unknown encoding {encoding:?}"),
            })?;
            out.push(Histogram {
                name,
                encoding,
                data,
            });
        }
        Ok(out)
    }

    /// One histogram of a run, decoded; `None` when the run has none by that name.
    pub fn histogram(
        &self,
        id: RunId,
        name: &str,
    ) -> Result<Option<hdrhistogram::Histogram<u64>>, Error> {
        let Some(h) = self.histograms(id)?.into_iter().find(|h| h.name == name) else {
            return Ok(None);
        };
        h.decode().map(Some).map_err(|message| Error::Histogram {
            run: id,
            name: name.to_owned(),
            message,
        })
    }

    /// Deletes runs (their labels and histograms with them); returns the ids that existed.
    /// A group left without runs (and without recorded failures) goes too.
    pub fn delete(&mut self, ids: &[RunId]) -> Result<Vec<RunId>, Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut deleted = Vec::new();
        for id in ids {
            if tx
                .execute("DELETE FROM runs WHERE id = ?1", [id.0])
                .map_err(err)?
                > 0
            {
                deleted.push(*id);
            }
        }
        tx.execute(
            "DELETE FROM groups WHERE NOT EXISTS (SELECT 1 FROM runs WHERE group_id = groups.id)
                AND NOT EXISTS (SELECT 1 FROM failures WHERE group_id = groups.id)",
            [],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(deleted)
    }
}

/// A file that exists, is not empty and does not start with SQLite's header is not ours: say so
/// before SQLite gets a chance to touch it.
fn check_header(path: &Path) -> Result<(), Error> {
    let mut file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        // Unreadable: let SQLite open it and say why.
        Err(_) => return Ok(()),
    };
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(Error::NotADatabase {
            path: path.to_owned(),
        });
    }
    let mut head = Vec::with_capacity(SQLITE_HEADER.len());
    (&mut file)
        .take(SQLITE_HEADER.len() as u64)
        .read_to_end(&mut head)
        .map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
    if head.is_empty() || head == SQLITE_HEADER {
        Ok(())
    } else {
        Err(Error::NotADatabase {
            path: path.to_owned(),
        })
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests;
