//! Per-test PostgreSQL databases on a real server, for the tests of the store and of the crates
//! that use it (feature `testing`; not for programs).
//!
//! The server is the one `SONDE_TEST_POSTGRES` names (a URL whose user may create databases;
//! `.ci/postgres start` starts one and prints it). Each [`PgTestDb`] is a database of its own,
//! created with a unique name and dropped when it goes. Without the variable a test skips with
//! a printed reason, unless `SONDE_TEST_REQUIRE_ALL=1`, which makes the skip a failure.

use std::sync::atomic::{AtomicU32, Ordering};

use postgres::{Client, NoTls};

use crate::{Location, PgUrl};

/// The variable naming the test server.
pub const POSTGRES_ENV: &str = "SONDE_TEST_POSTGRES";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A database of one test's own, dropped (with its connections) when this goes.
#[derive(Debug)]
pub struct PgTestDb {
    admin: String,
    name: String,
    url: String,
}

impl PgTestDb {
    /// A new database for `test`; `None` (the reason printed) when no server is configured.
    ///
    /// # Panics
    /// When the server cannot be reached or refuses to create the database, and when none is
    /// configured under `SONDE_TEST_REQUIRE_ALL=1`.
    pub fn create(test: &str) -> Option<Self> {
        let Some(admin) = std::env::var(POSTGRES_ENV).ok().filter(|u| !u.is_empty()) else {
            let why = format!(
                "no PostgreSQL server ({POSTGRES_ENV} unset; `.ci/postgres start` starts one and \
                 prints the URL to set it to)"
            );
            assert!(
                std::env::var("SONDE_TEST_REQUIRE_ALL").as_deref() != Ok("1"),
                "{test}: {why}; this prerequisite is required in CI (SONDE_TEST_REQUIRE_ALL=1)"
            );
            eprintln!("SKIP {test}: {why}");
            return None;
        };
        let tag: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!(
            "sonde_t_{}_{}_{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut client = admin_client(&admin);
        // One statement each: CREATE DATABASE cannot run in a batch's implicit transaction.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            client
                .batch_execute(&sql)
                .unwrap_or_else(|e| panic!("{sql}: {}", crate::pg::message(&e)));
        }
        let url = with_database(&admin, &name);
        Some(Self { admin, name, url })
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database as a store location.
    pub fn location(&self) -> Location {
        Location::Postgres(PgUrl(self.url.clone()))
    }

    /// The server's URL as `SONDE_TEST_POSTGRES` gives it (its own database, a user that may
    /// create databases and roles).
    pub fn admin_url(&self) -> &str {
        &self.admin
    }

    /// The database's name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        let mut client = admin_client(&self.admin);
        if let Err(e) = client.batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )) {
            eprintln!(
                "dropping the test database {}: {}",
                self.name,
                crate::pg::message(&e)
            );
        }
    }
}

fn admin_client(admin: &str) -> Client {
    let mut config: postgres::Config = admin
        .parse()
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}={admin}: {e}"));
    config.connect_timeout(crate::CONNECT_TIMEOUT);
    config
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}: cannot connect to the test server: {e}"))
}

/// `url` with its database replaced by `name` (the path of a `postgres://` URL).
fn with_database(url: &str, name: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}
