//! sonde's results database: every test's result, kept in one SQLite file, or in a
//! PostgreSQL database a team shares, so that runs can be listed, compared and drawn later.
//!
//! What a run keeps: the whole result document exactly as `--json` printed it; indexed columns
//! to find it by (time, test, protocol, server, labels, group) and its headline figures; and for
//! a latency run the full HDR histogram of its round-trip times in hdrhistogram's compact V2
//! serialized form, so that a distribution can be drawn and repetitions merged exactly.
//!
//! No rendering: the caller hands in the document as text and the figures it wants indexed,
//! and gets them back. Two backends behind one [`Store`], chosen by the [`Location`]:
//!
//! - a file: SQLite's own format (`rusqlite` with its bundled SQLite), written in WAL mode with
//!   a busy timeout so that two sonde processes saving at the same moment both land; the schema
//!   is versioned (`PRAGMA user_version`, migrated forward on open) and marked as sonde's
//!   (`PRAGMA application_id`): a file that is not sonde's database, or is corrupt, is reported
//!   with its path and never written;
//! - `postgres://...`: the same tables on a PostgreSQL server (the `postgres` crate), the same
//!   schema versions (kept in `sonde_schema`), every connection bounded in time.
//!
//! Every run, group and failure has a UUID made when it is first saved: [`Store::push`] copies
//! runs from one store to another idempotently by it, so a laptop that was offline pushes later
//! and nothing is stored twice.
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

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use uuid::Uuid;

mod pg;
mod sqlite;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use pg::{CONNECT_TIMEOUT, STATEMENT_TIMEOUT};

/// The schema version this sonde writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: u32 = 5;

/// Marks the file as sonde's (`PRAGMA application_id`): "SNDE".
pub const APPLICATION_ID: i32 = 0x534E_4445;

/// The histogram name of a latency run's round-trip times.
pub const HISTOGRAM_RTT: &str = "rtt";
/// `sonde load`: the round-trip times on the idle path.
pub const HISTOGRAM_IDLE_RTT: &str = "idle_rtt";
/// `sonde load`: the round-trip times while the load ran.
pub const HISTOGRAM_LOADED_RTT: &str = "loaded_rtt";

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
    /// A database of another program (an SQLite file, or a PostgreSQL database holding
    /// tables named as sonde's).
    #[error("{location}: a database that is not sonde's; left untouched, choose another with --db or SONDE_DB")]
    Foreign {
        /// The file, or the URL (its password hidden).
        location: String,
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
    #[error("{location}: written by a newer sonde (schema version {found}; this one knows up to {known})")]
    TooNew {
        /// The file, or the URL (its password hidden).
        location: String,
        /// Its schema version.
        found: u32,
        /// The newest this build knows.
        known: u32,
    },
    /// No database at the path (a reader does not create one).
    #[error("{location}: no results stored yet (no sonde database there)")]
    Missing {
        /// The file, or the URL (its password hidden).
        location: String,
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
    /// The PostgreSQL server could not be reached, or the connection broke (no answer from the
    /// server: refused, timed out, reset).
    #[error("{url}: the PostgreSQL server cannot be reached: {message}")]
    Unreachable {
        /// The URL, its password hidden.
        url: String,
        /// What the driver said.
        message: String,
    },
    /// The PostgreSQL server refused the write (no privilege, or a read-only server).
    #[error("{url}: the PostgreSQL server refused: {message}")]
    Refused {
        /// The URL, its password hidden.
        url: String,
        /// What the server said, with its SQLSTATE.
        message: String,
    },
    /// Any other PostgreSQL failure.
    #[error("{url}: {message}")]
    Postgres {
        /// The URL, its password hidden.
        url: String,
        /// What the server said, with its SQLSTATE.
        message: String,
    },
    /// A `postgres://` URL that does not parse.
    #[error("{url}: not a PostgreSQL URL the driver reads: {message}")]
    BadUrl {
        /// The URL, its password hidden.
        url: String,
        /// Why.
        message: String,
    },
    /// A stored UUID that does not parse (written by something else than sonde).
    #[error("{location}: a stored UUID {text:?} does not parse: {message}")]
    BadUuid {
        /// The database.
        location: String,
        /// The text stored.
        text: String,
        /// Why.
        message: String,
    },
    /// A run refers to a group the database does not hold.
    #[error("{location}: group {group} is referred to by a run but missing")]
    MissingGroup {
        /// The database.
        location: String,
        /// The group.
        group: GroupId,
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

/// A stored run's id in one database (SQLite's rowid, PostgreSQL's identity column): a run
/// pushed to another database gets another id there; its [`Uuid`] stays.
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

    /// A histogram as a backend read it.
    fn from_stored(run: RunId, name: String, encoding: &str, data: Vec<u8>) -> Result<Self, Error> {
        let encoding = HistogramEncoding::parse(encoding).ok_or_else(|| Error::Histogram {
            run,
            name: name.clone(),
            message: format!("unknown encoding {encoding:?}"),
        })?;
        Ok(Self {
            name,
            encoding,
            data,
        })
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
    /// Its identity in every database it is saved or pushed to; `None`: a new one is made. A
    /// caller that may save the same run twice (once into PostgreSQL, whose answer was lost,
    /// then into the local file) gives the same UUID to both.
    pub uuid: Option<Uuid>,
    /// Saved here in place of the shared database it was meant for: `sonde results push`
    /// sends it.
    pub to_push: bool,
}

/// A stored run as listed: everything but the document and histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Its id in this database.
    pub id: RunId,
    /// Its identity in every database.
    pub uuid: Uuid,
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
    /// Waiting here to be pushed to the shared database it was meant for.
    pub to_push: bool,
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
    /// Its id in this database.
    pub id: GroupId,
    /// Its identity in every database (a group pushed, or continued in the local file when
    /// the shared database went away, is the same group).
    pub uuid: Uuid,
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
    /// Only runs marked to push (saved here when the shared database was unreachable).
    pub to_push: bool,
}

/// Where a results database is: a file, or a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    File(PathBuf),
    /// A PostgreSQL database.
    Postgres(PgUrl),
}

impl Location {
    /// `postgres://...` or `postgresql://...` is a PostgreSQL database; anything else a file.
    pub fn new(s: impl Into<OsString>) -> Self {
        let s: OsString = s.into();
        match s.to_str() {
            Some(u) if PgUrl::is_url(u) => Self::Postgres(PgUrl(u.to_owned())),
            _ => Self::File(s.into()),
        }
    }

    /// The file, when it is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::File(p) => Some(p),
            Self::Postgres(_) => None,
        }
    }
}

impl fmt::Display for Location {
    /// The path, or the URL with its password hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => p.display().fmt(f),
            Self::Postgres(u) => u.fmt(f),
        }
    }
}

impl From<&Path> for Location {
    fn from(p: &Path) -> Self {
        Self::new(p.as_os_str())
    }
}

impl From<&PathBuf> for Location {
    fn from(p: &PathBuf) -> Self {
        Self::new(p.as_os_str())
    }
}

impl From<PathBuf> for Location {
    fn from(p: PathBuf) -> Self {
        Self::new(p)
    }
}

impl From<&Location> for Location {
    fn from(l: &Location) -> Self {
        l.clone()
    }
}

/// A PostgreSQL URL (`postgres://user:password@host:port/database?options`, libpq's syntax).
/// Shown with its password hidden; the whole URL only goes to the driver.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    fn is_url(s: &str) -> bool {
        s.starts_with("postgres://") || s.starts_with("postgresql://")
    }

    /// The URL with its password, for the driver.
    fn full(&self) -> &str {
        &self.0
    }
}

impl FromStr for PgUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if Self::is_url(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(format!(
                "{s:?}: expected a PostgreSQL URL, postgres://USER@HOST[:PORT]/DATABASE"
            ))
        }
    }
}

impl fmt::Display for PgUrl {
    /// The URL with the password (in the authority or as `password=`) replaced by `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.0;
        let scheme_end = s.find("://").map_or(0, |i| i + 3);
        let rest = &s[scheme_end..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => authority.to_owned(),
            },
            None => authority.to_owned(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|kv| match kv.split_once('=') {
                        Some(("password", _)) => "password=***".to_owned(),
                        _ => kv.to_owned(),
                    })
                    .collect();
                format!("{path}?{}", query.join("&"))
            }
            None => tail.to_owned(),
        };
        write!(f, "{}{authority}{tail}", &s[..scheme_end])
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({self})")
    }
}

/// The default database path: `$XDG_DATA_HOME/sonde/results.db` on Linux
/// (`~/.local/share/sonde/results.db`), the platform's data directory elsewhere. `None` when
/// the platform has no such directory (no home). It is also where a run meant for an
/// unreachable PostgreSQL database is kept until it is pushed.
pub fn default_path() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("sonde").join("results.db"))
}

/// What an insert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// A new run, with its id.
    New(RunId),
    /// A run with this UUID was already there (this id): nothing was written.
    AlreadyThere(RunId),
}

impl Inserted {
    /// The run's id, new or not.
    pub fn id(self) -> RunId {
        match self {
            Self::New(id) | Self::AlreadyThere(id) => id,
        }
    }
}

/// One run (or failure) handled by [`Store::push`].
#[derive(Debug, Clone, PartialEq)]
pub enum Pushed<'a> {
    /// A run: copied, or found there already.
    Run {
        /// The run as stored here.
        run: &'a RunSummary,
        /// What the destination did.
        inserted: Inserted,
    },
    /// A failure of a plan run: copied (true) or found there already.
    Failure {
        /// The failure.
        failure: &'a Failure,
        /// Copied now.
        copied: bool,
    },
}

/// What [`Store::push`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushCount {
    /// Runs copied.
    pub copied: usize,
    /// Runs that were there already (pushed before, or by a push interrupted after it landed).
    pub already_there: usize,
    /// Failures of plan runs copied.
    pub failures_copied: usize,
    /// Stopped by the caller before the end.
    pub stopped: bool,
}

/// The results database: an SQLite file or a PostgreSQL database, the same operations on both.
#[derive(Debug)]
pub struct Store {
    db: Db,
    location: Location,
}

#[derive(Debug)]
enum Db {
    Sqlite(sqlite::Sqlite),
    Postgres(pg::Postgres),
}

/// Calls the same method on either backend.
macro_rules! each {
    ($self:expr, $db:ident => $e:expr) => {
        match &$self.db {
            Db::Sqlite($db) => $e,
            Db::Postgres($db) => $e,
        }
    };
    (mut $self:expr, $db:ident => $e:expr) => {
        match &mut $self.db {
            Db::Sqlite($db) => $e,
            Db::Postgres($db) => $e,
        }
    };
}

impl Store {
    /// Opens the database for reading and writing: a file is created (with its directory) when
    /// there is none, a PostgreSQL database gets sonde's tables when it has none; an older
    /// schema is migrated forward. A database that is not sonde's is reported and left
    /// untouched.
    pub fn open(at: impl Into<Location>) -> Result<Self, Error> {
        let location = at.into();
        let db = match &location {
            Location::File(p) => Db::Sqlite(sqlite::Sqlite::open(p)?),
            Location::Postgres(u) => Db::Postgres(pg::Postgres::open(u, true)?),
        };
        Ok(Self { db, location })
    }

    /// Opens an existing database; [`Error::Missing`] when there is none (a reader does not
    /// create one, nor sonde's tables in an empty PostgreSQL database).
    pub fn open_existing(at: impl Into<Location>) -> Result<Self, Error> {
        let location = at.into();
        let db = match &location {
            Location::File(p) => Db::Sqlite(sqlite::Sqlite::open_existing(p)?),
            Location::Postgres(u) => Db::Postgres(pg::Postgres::open(u, false)?),
        };
        Ok(Self { db, location })
    }

    /// Where the database is.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The file, for an SQLite database.
    pub fn path(&self) -> Option<&Path> {
        match &self.db {
            Db::Sqlite(s) => Some(s.path()),
            Db::Postgres(_) => None,
        }
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<u32, Error> {
        each!(self, db => db.schema_version())
    }

    /// Starts a group (`kind`: `repeat`, `quick`, `sweep`) made at `created_unix_ms`.
    pub fn new_group(&mut self, kind: &str, created_unix_ms: u64) -> Result<GroupId, Error> {
        self.insert_group(&Group {
            id: GroupId(0),
            uuid: Uuid::new_v4(),
            created_unix_ms,
            kind: kind.to_owned(),
            plan: None,
        })
    }

    /// Starts a plan run (a group of kind `plan`) made at `created_unix_ms`, keeping its plan.
    pub fn new_plan_group(
        &mut self,
        plan: &GroupPlan,
        created_unix_ms: u64,
    ) -> Result<GroupId, Error> {
        self.insert_group(&Group {
            id: GroupId(0),
            uuid: Uuid::new_v4(),
            created_unix_ms,
            kind: "plan".to_owned(),
            plan: Some(plan.clone()),
        })
    }

    /// Stores a group under its UUID (its `id` is ignored), or finds the one stored under it:
    /// the same group in another database (a push, or a group continued in the local file when
    /// the shared database went away).
    pub fn insert_group(&mut self, group: &Group) -> Result<GroupId, Error> {
        each!(mut self, db => db.insert_group(group))
    }

    /// The group, if it exists.
    pub fn group(&self, id: GroupId) -> Result<Option<Group>, Error> {
        each!(self, db => db.group(id))
    }

    /// Saves a run with its labels and histograms, all or nothing; a run whose UUID is already
    /// stored is left as it is (nothing written, its id returned).
    pub fn insert(&mut self, run: &NewRun<'_>) -> Result<RunId, Error> {
        self.insert_run(run).map(Inserted::id)
    }

    /// [`Store::insert`], saying whether the run was new.
    pub fn insert_run(&mut self, run: &NewRun<'_>) -> Result<Inserted, Error> {
        for (i, l) in run.labels.iter().enumerate() {
            if run.labels[..i].iter().any(|o| o.key == l.key) {
                return Err(Error::DuplicateLabel(l.key.clone()));
            }
        }
        let uuid = run.uuid.unwrap_or_else(Uuid::new_v4);
        each!(mut self, db => db.insert(run, uuid))
    }

    /// Records a case that ran no test, with its labels; `to_push`: saved here in place of
    /// the shared database it was meant for.
    pub fn insert_failure(&mut self, failure: &Failure, to_push: bool) -> Result<(), Error> {
        each!(mut self, db => db.insert_failure(failure, Uuid::new_v4(), to_push)).map(|_| ())
    }

    /// The failures recorded in a group, oldest first.
    pub fn failures(&self, group: GroupId) -> Result<Vec<Failure>, Error> {
        let f = each!(self, db => db.failures(Some(group)))?;
        Ok(f.into_iter().map(|(_, f)| f).collect())
    }

    /// The runs that match, newest first (by start time, then id).
    pub fn runs(&self, filter: &Filter) -> Result<Vec<RunSummary>, Error> {
        each!(self, db => db.runs(filter))
    }

    /// A run's labels, sorted by key.
    pub fn labels(&self, id: RunId) -> Result<Vec<Label>, Error> {
        each!(self, db => db.labels(id))
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
        if let Db::Postgres(db) = &self.db {
            // One round trip for all the documents: the server may be across a WAN.
            let runs = db.runs(filter)?;
            let ids: Vec<RunId> = runs.iter().map(|r| r.id).collect();
            let mut documents = db.documents(&ids)?;
            return Ok(runs
                .into_iter()
                .map(|summary| StoredRun {
                    document: documents.remove(&summary.id.0).unwrap_or_default(),
                    summary,
                })
                .collect());
        }
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
        each!(self, db => db.document(id))
    }

    /// A run's histograms, by name.
    pub fn histograms(&self, id: RunId) -> Result<Vec<Histogram>, Error> {
        each!(self, db => db.histograms(id))
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
    /// A group these runs leave without runs (and without recorded failures) goes too.
    pub fn delete(&mut self, ids: &[RunId]) -> Result<Vec<RunId>, Error> {
        each!(mut self, db => db.delete(ids))
    }

    /// Copies the runs that match `filter` into `to`, oldest first, each with its labels,
    /// histograms (the same bytes) and group (found there by its UUID, or made), in its own
    /// transaction; then, when `filter.to_push`, the failures marked to push. A run already
    /// there (by UUID) is not written again, so a push interrupted at any point and repeated
    /// stores each run once. Each run pushed loses its "to push" mark here. `each` hears of
    /// every run and failure and may stop the push (`ControlFlow::Break`).
    pub fn push(
        &mut self,
        to: &mut Store,
        filter: &Filter,
        mut each: impl FnMut(Pushed<'_>) -> ControlFlow<()>,
    ) -> Result<PushCount, Error> {
        let mut count = PushCount::default();
        let mut runs = self.runs(filter)?;
        runs.reverse();
        let mut groups: Vec<(GroupId, GroupId)> = Vec::new();
        for run in &runs {
            let group = match run.group {
                Some(g) => Some(self.group_there(g, to, &mut groups)?),
                None => None,
            };
            let document = self.document(run.id)?.unwrap_or_default();
            let histograms = self.histograms(run.id)?;
            let inserted = to.insert_run(&NewRun {
                time_unix_ms: run.time_unix_ms,
                test: &run.test,
                protocol: run.protocol.as_deref(),
                server: run.server.as_deref(),
                labels: &run.labels,
                group,
                interrupted: run.interrupted,
                headline: run.headline,
                document: &document,
                histograms: &histograms,
                uuid: Some(run.uuid),
                to_push: false,
            })?;
            match inserted {
                Inserted::New(_) => count.copied += 1,
                Inserted::AlreadyThere(_) => count.already_there += 1,
            }
            if run.to_push {
                each!(mut self, db => db.clear_mark(Some(run.id), None))?;
            }
            if each(Pushed::Run { run, inserted }).is_break() {
                count.stopped = true;
                return Ok(count);
            }
        }
        if filter.to_push {
            let failures = each!(self, db => db.failures(None))?;
            for (uuid, failure) in &failures {
                let group = self.group_there(failure.group, to, &mut groups)?;
                let copied = each!(mut to, db => db.insert_failure(
                    &Failure { group, ..failure.clone() },
                    *uuid,
                    false,
                ))?;
                if copied {
                    count.failures_copied += 1;
                }
                each!(mut self, db => db.clear_mark(None, Some(*uuid)))?;
                if each(Pushed::Failure { failure, copied }).is_break() {
                    count.stopped = true;
                    return Ok(count);
                }
            }
        }
        Ok(count)
    }

    /// The id in `to` of this store's group `g` (made there under its UUID when missing).
    fn group_there(
        &self,
        g: GroupId,
        to: &mut Store,
        known: &mut Vec<(GroupId, GroupId)>,
    ) -> Result<GroupId, Error> {
        if let Some((_, there)) = known.iter().find(|(here, _)| *here == g) {
            return Ok(*there);
        }
        let group = self.group(g)?.ok_or_else(|| Error::MissingGroup {
            location: self.location.to_string(),
            group: g,
        })?;
        let there = to.insert_group(&group)?;
        known.push((g, there));
        Ok(there)
    }

    /// The SQLite backend, for tests that look inside.
    #[cfg(test)]
    fn sqlite(&self) -> Option<&sqlite::Sqlite> {
        match &self.db {
            Db::Sqlite(s) => Some(s),
            Db::Postgres(_) => None,
        }
    }

    /// The PostgreSQL backend, for tests that look inside.
    #[cfg(test)]
    fn postgres(&self) -> Option<&pg::Postgres> {
        match &self.db {
            Db::Sqlite(_) => None,
            Db::Postgres(p) => Some(p),
        }
    }
}

/// The columns every run listing reads, in this order.
const SUMMARY_COLUMNS: &str = "id, uuid, time_unix_ms, test, protocol, server, group_id, \
    interrupted, to_push, rtt_mean_ns, rtt_p50_ns, rtt_p99_ns, rtt_p9999_ns, bits_per_second, \
    packets_per_second, connections_per_second, loss_percent";

/// A query argument, bound by either backend.
enum Arg {
    Int(i64),
    Text(String),
}

/// A filter as SQL: `WHERE ... ORDER BY ... LIMIT ...` with its arguments numbered in the
/// backend's style (`?1` for SQLite, `$1` for PostgreSQL).
struct Where {
    sql: String,
    args: Vec<Arg>,
}

fn where_clause(filter: &Filter, mark: char) -> Where {
    use std::fmt::Write as _;
    let mut w = Where {
        sql: String::from("WHERE TRUE"),
        args: Vec::new(),
    };
    let arg = |w: &mut Where, a: Arg| -> String {
        w.args.push(a);
        format!("{mark}{}", w.args.len())
    };
    if !filter.ids.is_empty() {
        let mut list = Vec::new();
        for id in &filter.ids {
            list.push(arg(&mut w, Arg::Int(id.0)));
        }
        let _ = write!(w.sql, " AND id IN ({})", list.join(", "));
    }
    if let Some(test) = &filter.test {
        let p = arg(&mut w, Arg::Text(test.clone()));
        let _ = write!(w.sql, " AND test = {p}");
    }
    // Each label is a lookup in the labels table's (key, value) index, which yields the runs
    // that carry it: never a scan of every run.
    for l in &filter.labels {
        let k = arg(&mut w, Arg::Text(l.key.clone()));
        let v = arg(&mut w, Arg::Text(l.value.clone()));
        let _ = write!(
            w.sql,
            " AND id IN (SELECT run_id FROM labels WHERE key = {k} AND value = {v})"
        );
    }
    if let Some(since) = filter.since_unix_ms {
        let p = arg(&mut w, Arg::Int(to_i64(since)));
        let _ = write!(w.sql, " AND time_unix_ms >= {p}");
    }
    if let Some(g) = filter.group {
        let p = arg(&mut w, Arg::Int(g.0));
        let _ = write!(w.sql, " AND group_id = {p}");
    }
    if filter.to_push {
        w.sql.push_str(" AND to_push");
    }
    w.sql.push_str(" ORDER BY time_unix_ms DESC, id DESC");
    if let Some(n) = filter.last {
        let p = arg(&mut w, Arg::Int(to_i64(n)));
        let _ = write!(w.sql, " LIMIT {p}");
    }
    w
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests;
