//! The SQLite backend: one file (`rusqlite` with its bundled SQLite), in WAL mode with a busy
//! timeout so that two sonde processes saving at the same moment both land. The schema is
//! versioned (`PRAGMA user_version`, migrated forward on open) and marked as sonde's
//! (`PRAGMA application_id`).

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, params_from_iter, Connection, ErrorCode, OptionalExtension};
use uuid::Uuid;

use crate::{
    to_i64, to_u64, where_clause, Arg, Error, Failure, Filter, Group, GroupId, GroupPlan, Headline,
    Histogram, Inserted, Label, Location, NewRun, RunId, RunSummary, APPLICATION_ID,
    SCHEMA_VERSION, SUMMARY_COLUMNS,
};

/// How long a writer waits for another process's write to finish before giving up. Saving a run
/// takes milliseconds; this only has to outlast another sonde's save.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The first 16 bytes of every SQLite 3 database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// A version 4 UUID made by SQLite itself (for runs saved before runs had one): 122 random
/// bits, the version nibble 4 and the variant bits 10.
macro_rules! random_uuid {
    () => {
        "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || \
         substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || \
         substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))"
    };
}

/// The migrations, in order: entry `n` takes the schema from version `n` to `n + 1`. Never edit
/// one that has been released; add the next. `pg.rs` has the same list in PostgreSQL's
/// dialect: a version means the same tables, columns and indexes in both.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // 5: every run, group and failure has a UUID (its identity in every database it is copied
    // to: `sonde results push` is idempotent by it; the ones saved before get one now), and a
    // run or failure saved here in place of an unreachable shared database is marked to push.
    concat!(
        "ALTER TABLE runs ADD COLUMN uuid TEXT;
        UPDATE runs SET uuid = ",
        random_uuid!(),
        ";
        CREATE UNIQUE INDEX runs_uuid ON runs (uuid);
        ALTER TABLE runs ADD COLUMN to_push INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX runs_to_push ON runs (to_push) WHERE to_push;
        ALTER TABLE groups ADD COLUMN uuid TEXT;
        UPDATE groups SET uuid = ",
        random_uuid!(),
        ";
        CREATE UNIQUE INDEX groups_uuid ON groups (uuid);
        ALTER TABLE failures ADD COLUMN uuid TEXT;
        UPDATE failures SET uuid = ",
        random_uuid!(),
        ";
        CREATE UNIQUE INDEX failures_uuid ON failures (uuid);
        ALTER TABLE failures ADD COLUMN to_push INTEGER NOT NULL DEFAULT 0;"
    ),
];

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

/// A results database in an SQLite file.
#[derive(Debug)]
pub(crate) struct Sqlite {
    conn: Connection,
    path: PathBuf,
}

fn uuid_text(u: Uuid) -> String {
    u.hyphenated().to_string()
}

fn uuid_of(path: &Path, text: Option<String>) -> Result<Uuid, Error> {
    let text = text.unwrap_or_default();
    Uuid::parse_str(&text).map_err(|e| Error::BadUuid {
        location: Location::File(path.to_owned()).to_string(),
        text,
        message: e.to_string(),
    })
}

impl Sqlite {
    pub(crate) fn open(path: &Path) -> Result<Self, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        Self::open_at(path)
    }

    pub(crate) fn open_existing(path: &Path) -> Result<Self, Error> {
        if !path.exists() {
            return Err(Error::Missing {
                location: path.display().to_string(),
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

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn schema_version(&self) -> Result<u32, Error> {
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
                location: self.path.display().to_string(),
            });
        }
        if version > SCHEMA_VERSION {
            return Err(Error::TooNew {
                location: self.path.display().to_string(),
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
        let found = read_identity(&tx).map_err(err)?;
        // Nothing was written: ending it is only letting go of the read.
        tx.rollback().map_err(err)?;
        Ok(found)
    }

    /// Applies the migrations up to `target`, in one transaction that first takes the write
    /// lock, so that two processes opening a new database at once migrate it once.
    pub(crate) fn migrate(&mut self, target: u32) -> Result<(), Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        // Read again under the lock: another process may have migrated meanwhile.
        let (app_id, version, objects) = read_identity(&tx).map_err(err)?;
        if app_id != APPLICATION_ID {
            if app_id != 0 || objects != 0 {
                return Err(Error::Foreign {
                    location: path.display().to_string(),
                });
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

    /// Inserts a group under its UUID, or finds the one already stored under it.
    pub(crate) fn insert_group(&mut self, g: &Group) -> Result<GroupId, Error> {
        let (file, text) = match &g.plan {
            Some(p) => (Some(p.file.as_str()), Some(p.text.as_str())),
            None => (None, None),
        };
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(
            "INSERT INTO groups (uuid, created_unix_ms, kind, plan_file, plan_text)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (uuid) DO NOTHING",
            params![
                uuid_text(g.uuid),
                to_i64(g.created_unix_ms),
                g.kind,
                file,
                text
            ],
        )
        .map_err(err)?;
        let id: i64 = tx
            .query_row(
                "SELECT id FROM groups WHERE uuid = ?1",
                [uuid_text(g.uuid)],
                |r| r.get(0),
            )
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(GroupId(id))
    }

    pub(crate) fn group(&self, id: GroupId) -> Result<Option<Group>, Error> {
        let row = self
            .conn
            .query_row(
                "SELECT id, uuid, created_unix_ms, kind, plan_file, plan_text FROM groups
                 WHERE id = ?1",
                [id.0],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((id, uuid, created, kind, file, text)) = row else {
            return Ok(None);
        };
        Ok(Some(Group {
            id: GroupId(id),
            uuid: uuid_of(&self.path, uuid)?,
            created_unix_ms: to_u64(created),
            kind,
            plan: file.zip(text).map(|(file, text)| GroupPlan { file, text }),
        }))
    }

    pub(crate) fn insert(&mut self, run: &NewRun<'_>, uuid: Uuid) -> Result<Inserted, Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let h = &run.headline;
        let id: Option<i64> = tx
            .query_row(
                "INSERT INTO runs (uuid, time_unix_ms, test, protocol, server, group_id,
                    interrupted, to_push, rtt_mean_ns, rtt_p50_ns, rtt_p99_ns, rtt_p9999_ns,
                    bits_per_second, packets_per_second, connections_per_second, loss_percent,
                    document)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17)
                 ON CONFLICT (uuid) DO NOTHING RETURNING id",
                params![
                    uuid_text(uuid),
                    to_i64(run.time_unix_ms),
                    run.test,
                    run.protocol,
                    run.server,
                    run.group.map(|g| g.0),
                    run.interrupted,
                    run.to_push,
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
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        let Some(id) = id else {
            // Already stored under this UUID: nothing written.
            let id: i64 = tx
                .query_row(
                    "SELECT id FROM runs WHERE uuid = ?1",
                    [uuid_text(uuid)],
                    |r| r.get(0),
                )
                .map_err(err)?;
            return Ok(Inserted::AlreadyThere(RunId(id)));
        };
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
        Ok(Inserted::New(RunId(id)))
    }

    pub(crate) fn insert_failure(
        &mut self,
        failure: &Failure,
        uuid: Uuid,
        to_push: bool,
    ) -> Result<bool, Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let id: Option<i64> = tx
            .query_row(
                "INSERT INTO failures (uuid, group_id, time_unix_ms, test, reason, exit_code,
                    to_push)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (uuid) DO NOTHING RETURNING id",
                params![
                    uuid_text(uuid),
                    failure.group.0,
                    to_i64(failure.time_unix_ms),
                    failure.test,
                    failure.reason,
                    failure.exit_code,
                    to_push
                ],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        let Some(id) = id else {
            return Ok(false);
        };
        for l in &failure.labels {
            tx.execute(
                "INSERT INTO failure_labels (failure_id, key, value) VALUES (?1, ?2, ?3)",
                params![id, l.key, l.value],
            )
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        Ok(true)
    }

    /// The failures of a group (or, with `group` `None`, those marked to push), oldest first,
    /// with their UUIDs.
    pub(crate) fn failures(&self, group: Option<GroupId>) -> Result<Vec<(Uuid, Failure)>, Error> {
        let err = |e| self.err(e);
        let sql = if group.is_some() {
            "SELECT id, uuid, group_id, time_unix_ms, test, reason, exit_code FROM failures
             WHERE group_id = ?1 ORDER BY id"
        } else {
            "SELECT id, uuid, group_id, time_unix_ms, test, reason, exit_code FROM failures
             WHERE to_push ORDER BY id"
        };
        let mut stmt = self.conn.prepare(sql).map_err(err)?;
        let args: Vec<i64> = group.map(|g| g.0).into_iter().collect();
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, i64>(2)?,
                    to_u64(r.get(3)?),
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, u8>(6)?,
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
        for (id, uuid, group, time_unix_ms, test, reason, exit_code) in rows {
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
            out.push((
                uuid_of(&self.path, uuid)?,
                Failure {
                    group: GroupId(group),
                    time_unix_ms,
                    test,
                    labels,
                    reason,
                    exit_code,
                },
            ));
        }
        Ok(out)
    }

    pub(crate) fn runs(&self, filter: &Filter) -> Result<Vec<RunSummary>, Error> {
        let w = where_clause(filter, '?');
        let sql = format!("SELECT {SUMMARY_COLUMNS} FROM runs {}", w.sql);
        let args = w.args.into_iter().map(|a| match a {
            Arg::Int(i) => rusqlite::types::Value::Integer(i),
            Arg::Text(s) => rusqlite::types::Value::Text(s),
        });
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok((
                    r.get::<_, Option<String>>(1)?,
                    RunSummary {
                        id: RunId(r.get(0)?),
                        uuid: Uuid::nil(),
                        time_unix_ms: to_u64(r.get(2)?),
                        test: r.get(3)?,
                        protocol: r.get(4)?,
                        server: r.get(5)?,
                        group: r.get::<_, Option<i64>>(6)?.map(GroupId),
                        interrupted: r.get(7)?,
                        to_push: r.get(8)?,
                        labels: Vec::new(),
                        headline: Headline {
                            rtt_mean_ns: r.get(9)?,
                            rtt_p50_ns: r.get::<_, Option<i64>>(10)?.map(to_u64),
                            rtt_p99_ns: r.get::<_, Option<i64>>(11)?.map(to_u64),
                            rtt_p9999_ns: r.get::<_, Option<i64>>(12)?.map(to_u64),
                            bits_per_second: r.get(13)?,
                            packets_per_second: r.get(14)?,
                            connections_per_second: r.get(15)?,
                            loss_percent: r.get(16)?,
                        },
                    },
                ))
            })
            .map_err(|e| self.err(e))?;
        let rows = rows
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        let mut runs = Vec::with_capacity(rows.len());
        for (uuid, mut run) in rows {
            run.uuid = uuid_of(&self.path, uuid)?;
            run.labels = self.labels(run.id)?;
            runs.push(run);
        }
        Ok(runs)
    }

    /// The query plan SQLite chooses for a filter (tests check that a label is looked up in
    /// its index).
    #[cfg(test)]
    pub(crate) fn explain(&self, filter: &Filter) -> Vec<String> {
        let w = where_clause(filter, '?');
        let sql = format!("EXPLAIN QUERY PLAN SELECT id FROM runs {}", w.sql);
        let args = w.args.into_iter().map(|a| match a {
            Arg::Int(i) => rusqlite::types::Value::Integer(i),
            Arg::Text(s) => rusqlite::types::Value::Text(s),
        });
        let mut stmt = self.conn.prepare(&sql).expect("explain");
        stmt.query_map(params_from_iter(args), |r| r.get::<_, String>(3))
            .expect("explain")
            .collect::<Result<_, _>>()
            .expect("explain")
    }

    pub(crate) fn labels(&self, id: RunId) -> Result<Vec<Label>, Error> {
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

    pub(crate) fn document(&self, id: RunId) -> Result<Option<String>, Error> {
        self.conn
            .query_row("SELECT document FROM runs WHERE id = ?1", [id.0], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))
    }

    pub(crate) fn histograms(&self, id: RunId) -> Result<Vec<Histogram>, Error> {
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
            out.push(Histogram::from_stored(id, name, &encoding, data)?);
        }
        Ok(out)
    }

    /// Clears the "to push" mark of a run or a failure (`failure`: the failure's UUID).
    pub(crate) fn clear_mark(
        &mut self,
        run: Option<RunId>,
        failure: Option<Uuid>,
    ) -> Result<(), Error> {
        if let Some(id) = run {
            self.conn
                .execute("UPDATE runs SET to_push = 0 WHERE id = ?1", [id.0])
                .map_err(|e| self.err(e))?;
        }
        if let Some(u) = failure {
            self.conn
                .execute(
                    "UPDATE failures SET to_push = 0 WHERE uuid = ?1",
                    [uuid_text(u)],
                )
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    pub(crate) fn delete(&mut self, ids: &[RunId]) -> Result<Vec<RunId>, Error> {
        let path = self.path.clone();
        let err = |e| Error::sqlite(&path, e);
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut deleted = Vec::new();
        for id in ids {
            let group: Option<Option<i64>> = tx
                .query_row(
                    "DELETE FROM runs WHERE id = ?1 RETURNING group_id",
                    [id.0],
                    |r| r.get(0),
                )
                .optional()
                .map_err(err)?;
            let Some(group) = group else { continue };
            deleted.push(*id);
            // Only the groups these runs leave empty: a group another client has just made
            // (its first run not saved yet) is not this command's to remove.
            if let Some(g) = group {
                tx.execute(
                    "DELETE FROM groups WHERE id = ?1
                        AND NOT EXISTS (SELECT 1 FROM runs WHERE group_id = ?1)
                        AND NOT EXISTS (SELECT 1 FROM failures WHERE group_id = ?1)",
                    [g],
                )
                .map_err(err)?;
            }
        }
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

/// (application_id, user_version, number of schema objects) as `conn` sees them (inside the
/// caller's transaction).
fn read_identity(conn: &rusqlite::Connection) -> rusqlite::Result<(i32, u32, i64)> {
    let app_id = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let objects = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    Ok((app_id, version, objects))
}
