//! Saving results in the results database: the options every test takes (`--db`, `--no-save`,
//! `--label`, `--repeat`, `--pause`), and the one place a result is labelled, printed and
//! becomes a stored run.
//!
//! A result that cannot be saved is still printed: saving warns on stderr (with the path and
//! why) and never changes the exit code. A result meant for a PostgreSQL database that cannot
//! be reached (or refuses the write) is saved in the local file instead, marked to push, and
//! `sonde results push` sends it later: nothing is lost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use sonde_report::{Labels, TestResult};
use sonde_store::{
    Group, GroupId, Headline, Histogram, Label, Location, NewRun, RunId, Store, Uuid,
};

use crate::output::{print, OutputOpt};

/// The environment variable that chooses the database when `--db` is not given.
pub(crate) const DB_ENV: &str = "SONDE_DB";

/// Options of every test subcommand: where its result is saved.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Saving results")]
pub(crate) struct SaveOpt {
    /// The results database: a file, or a PostgreSQL database a team shares
    /// (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`; when it cannot be reached the result
    /// is saved in the default file, marked for `sonde results push`) [default: $SONDE_DB, else
    /// $XDG_DATA_HOME/sonde/results.db, i.e. ~/.local/share/sonde/results.db]
    #[arg(long, value_name = "PATH|URL")]
    db: Option<PathBuf>,
    /// Do not save this result (it is still printed)
    #[arg(long)]
    no_save: bool,
    /// Name the case this run measures (repeatable: `--label path=private --label zone=other`);
    /// the labels are in the JSON (`labels`), the CSV and the database, where `sonde results
    /// --label` finds them
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<Label>,
    /// Run the test N times, one session after another, saved as one group (`sonde results
    /// --group ID`): a case gets a distribution of runs, not one number. Each run is printed
    /// as it ends (--json: one document per run; --csv: one header), then the group's id
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// With --repeat: wait this long between runs, seconds (to let queues drain, or to spread
    /// the runs over time)
    #[arg(long, value_name = "SECS", requires = "repeat", value_parser = crate::units::seconds)]
    pause: Option<Duration>,
}

fn parse_label(s: &str) -> Result<Label, String> {
    s.parse::<Label>().map_err(|e| e.to_string())
}

/// The database: `--db`, else `$SONDE_DB`, else the file in the platform's data directory. A
/// `postgres://` or `postgresql://` URL is a PostgreSQL database, anything else a file.
pub(crate) fn db_location(flag: Option<&Path>) -> anyhow::Result<Location> {
    if let Some(p) = flag {
        return Ok(Location::from(p));
    }
    if let Some(p) = std::env::var_os(DB_ENV).filter(|p| !p.is_empty()) {
        return Ok(Location::new(p));
    }
    local_path().map(Location::File)
}

/// The local file: where results are saved when no database is chosen, and where a result
/// meant for an unreachable PostgreSQL database waits to be pushed.
pub(crate) fn local_path() -> anyhow::Result<PathBuf> {
    sonde_store::default_path().ok_or_else(|| {
        anyhow::anyhow!(
            "no data directory for the results database (no home directory?): give --db PATH \
             or set {DB_ENV}"
        )
    })
}

/// Whether a failure to open or write a PostgreSQL database is one the local file stands in
/// for: every failure of the server (unreachable, refused, any error it answered); not a URL
/// that does not parse, which will never work.
pub(crate) fn falls_back(e: &sonde_store::Error) -> bool {
    !matches!(e, sonde_store::Error::BadUrl { .. })
}

/// Opens the local file in place of `remote`, saying so on stderr in one line: why, where the
/// results go, and how they get to `remote` later. An error says why the local file could not
/// be opened either (the caller says the rest).
pub(crate) fn open_fallback(remote: &Location, why: &sonde_store::Error) -> anyhow::Result<Store> {
    let local = local_path()?;
    let store = Store::open(&local)?;
    eprintln!(
        "sonde: warning: {why}; saved in {} instead, marked to push: `sonde results push` sends \
         it to {remote}",
        local.display()
    );
    Ok(store)
}

/// A test's result and the RTT histograms behind it: what is printed and what is saved.
pub(crate) struct Measured {
    pub(crate) result: TestResult,
    pub(crate) histograms: Vec<Histogram>,
}

impl From<TestResult> for Measured {
    fn from(result: TestResult) -> Self {
        Self {
            result,
            histograms: Vec::new(),
        }
    }
}

/// A result document of the client's with no histogram for the store.
macro_rules! measured_from_result {
    ($($result:ty => $variant:ident),* $(,)?) => {$(
        impl From<$result> for Measured {
            fn from(result: $result) -> Self {
                Self::from(TestResult::$variant(result))
            }
        }
    )*};
}

measured_from_result!(
    sonde_report::LatencyResult => Latency,
    sonde_report::ThroughputResult => Throughput,
    sonde_report::PpsResult => Pps,
    sonde_report::CrrResult => Crr,
    sonde_report::MtuResult => Mtu,
);

impl From<sonde_client::LatencyMeasurement> for Measured {
    fn from(m: sonde_client::LatencyMeasurement) -> Self {
        Self {
            result: TestResult::Latency(m.result),
            histograms: vec![histogram(sonde_store::HISTOGRAM_RTT, m.rtt_histogram)],
        }
    }
}

impl From<sonde_client::LoadMeasurement> for Measured {
    fn from(m: sonde_client::LoadMeasurement) -> Self {
        Self {
            result: TestResult::Load(m.result),
            histograms: vec![
                histogram(sonde_store::HISTOGRAM_IDLE_RTT, m.idle_rtt_histogram),
                histogram(sonde_store::HISTOGRAM_LOADED_RTT, m.loaded_rtt_histogram),
            ],
        }
    }
}

fn histogram(name: &str, data: Vec<u8>) -> Histogram {
    Histogram {
        name: name.to_owned(),
        encoding: sonde_store::HistogramEncoding::HdrV2Deflate,
        data,
    }
}

/// Saves the runs of one command: opens the database at the first save, puts every run in one
/// group when asked, and warns (once for a database that cannot be opened) instead of failing.
pub(crate) struct Saver {
    /// `None` with `--no-save`, or when the path could not be found (already warned).
    location: Option<Location>,
    labels: Labels,
    store: Option<Store>,
    /// Saving into the local file in place of an unreachable PostgreSQL database: every run
    /// from now on goes there, marked to push.
    fallback: Option<Store>,
    group_kind: Option<&'static str>,
    /// The group the runs go in (made at the first save, or given): its UUID makes it the same
    /// group in the local file when the runs have to go there.
    group: Option<Group>,
    /// Its id where the first run was saved.
    group_id: Option<GroupId>,
    /// Its id in the local file, once runs went there.
    fallback_group: Option<GroupId>,
    /// Documents printed so far (the CSV header goes out once).
    printed: usize,
    /// A plan's case: nothing printed (the plan prints its matrix at the end).
    quiet: bool,
}

impl Saver {
    /// The saver of one command; a label key given twice is a usage error.
    pub(crate) fn new(opt: &SaveOpt) -> anyhow::Result<Self> {
        let mut labels = Labels::new();
        for l in &opt.labels {
            if labels.insert(l.key.clone(), l.value.clone()).is_some() {
                return Err(crate::units::BadValue(format!(
                    "--label {}: the key {:?} is given twice",
                    l, l.key
                ))
                .into());
            }
        }
        let location = if opt.no_save {
            None
        } else {
            match db_location(opt.db.as_deref()) {
                Ok(p) => Some(p),
                Err(e) => {
                    warn_not_saved(&format!("{e:#}"));
                    None
                }
            }
        };
        Ok(Self {
            location,
            labels,
            store: None,
            fallback: None,
            group_kind: None,
            group: None,
            group_id: None,
            fallback_group: None,
            printed: 0,
            quiet: false,
        })
    }

    /// The saver of one case of a plan run: saves into `location`, in the plan run's group
    /// (`group`, stored there as `group_id`), with the case's labels, and prints nothing.
    /// `location` is the local file itself when the plan run stands in for an unreachable
    /// PostgreSQL database (`to_push`): its runs are marked to push.
    pub(crate) fn plan_case(
        location: Location,
        group: Group,
        labels: Labels,
        to_push: bool,
    ) -> anyhow::Result<Self> {
        let mut saver = Self {
            location: Some(location.clone()),
            labels,
            store: None,
            fallback: None,
            group_kind: Some("plan"),
            group_id: Some(group.id),
            group: Some(group),
            fallback_group: None,
            printed: 0,
            quiet: true,
        };
        if to_push {
            saver.fallback = Some(Store::open(location)?);
            saver.fallback_group = saver.group_id;
        }
        Ok(saver)
    }

    /// `--label` as given.
    pub(crate) fn labels(&self) -> &Labels {
        &self.labels
    }

    /// Puts `--label` (and `extra`, the case of a quick run or the value of a sweep step,
    /// unless `--label` names that key itself) in the result's documents.
    pub(crate) fn label(&self, result: &mut TestResult, extra: Option<(&str, String)>) {
        let mut labels = self.labels.clone();
        if let Some((key, value)) = extra {
            labels.entry(key.to_owned()).or_insert(value);
        }
        result.kind_mut().set_labels(labels);
    }

    /// Every run saved from now on goes in one group of this kind (`repeat`, `quick`,
    /// `sweep`), made at the first save.
    pub(crate) fn grouped(&mut self, kind: &'static str) {
        if self.group_kind.is_none() {
            self.group_kind = Some(kind);
        }
    }

    /// Prints a result in the chosen format. Repeated runs follow each other: JSON documents
    /// one after another, CSV rows under the first run's header, tables a blank line apart.
    pub(crate) fn print(&mut self, output: OutputOpt, result: &TestResult) -> anyhow::Result<()> {
        if self.quiet {
            return Ok(());
        }
        let exporter = output.exporter();
        let text = if self.printed == 0 {
            exporter.document(result)
        } else {
            exporter.next_document(result)
        };
        self.printed += 1;
        print(&text)
    }

    /// A single run's end: labels it, prints it, saves it.
    pub(crate) fn print_and_save(
        &mut self,
        output: OutputOpt,
        m: &mut Measured,
    ) -> anyhow::Result<()> {
        self.label(&mut m.result, None);
        self.print(output, &m.result)?;
        self.save(m);
        Ok(())
    }

    /// The group the runs were saved in, once one was, and where: `None` the database chosen;
    /// the local file's path when some went there in its place.
    pub(crate) fn group(&self) -> Option<(GroupId, Option<PathBuf>)> {
        match (self.group_id, self.fallback_group) {
            (Some(g), _) => Some((g, None)),
            (None, Some(g)) => Some((
                g,
                self.fallback
                    .as_ref()
                    .and_then(|s| s.path().map(Path::to_owned)),
            )),
            (None, None) => None,
        }
    }

    /// Saves one run (not `quick` or a sweep as a whole: their parts are saved one by one);
    /// warns on stderr when it cannot.
    pub(crate) fn save(&mut self, m: &Measured) -> Option<RunId> {
        let location = self.location.clone()?;
        let indexed = Indexed::of(&m.result)?;
        if let (Some(kind), None) = (self.group_kind, &self.group) {
            self.group = Some(Group {
                id: GroupId(0),
                uuid: Uuid::new_v4(),
                created_unix_ms: indexed.time_unix_ms,
                kind: kind.to_owned(),
                plan: None,
            });
        }
        // One UUID for both tries: a save PostgreSQL committed but whose answer was lost, then
        // saved in the local file, is one run when it is pushed.
        let uuid = Uuid::new_v4();
        if self.fallback.is_none() {
            match self.try_save(&location, m, &indexed, uuid) {
                Ok(id) => return Some(id),
                Err(e) if matches!(location, Location::Postgres(_)) && falls_back(&e) => {
                    match open_fallback(&location, &e) {
                        Ok(local) => self.fallback = Some(local),
                        Err(local) => {
                            warn_not_saved(&format!("{e}; nor in the local file: {local:#}"));
                            self.location = None;
                            return None;
                        }
                    }
                }
                Err(e) => {
                    warn_not_saved(&e.to_string());
                    // A database that does not open will not open for the next run either.
                    if self.store.is_none() {
                        self.location = None;
                    }
                    return None;
                }
            }
        }
        match self.try_fallback(m, &indexed, uuid) {
            Ok(id) => Some(id),
            Err(e) => {
                warn_not_saved(&e.to_string());
                None
            }
        }
    }

    fn try_save(
        &mut self,
        location: &Location,
        m: &Measured,
        indexed: &Indexed<'_>,
        uuid: Uuid,
    ) -> Result<RunId, sonde_store::Error> {
        if self.store.is_none() {
            self.store = Some(Store::open(location)?);
        }
        let Some(store) = self.store.as_mut() else {
            unreachable!("opened above")
        };
        if let (Some(group), None) = (&self.group, self.group_id) {
            self.group_id = Some(store.insert_group(group)?);
        }
        insert(store, m, indexed, self.group_id, uuid, false)
    }

    /// Saves into the local file, marked to push, in the same group (by UUID).
    fn try_fallback(
        &mut self,
        m: &Measured,
        indexed: &Indexed<'_>,
        uuid: Uuid,
    ) -> Result<RunId, sonde_store::Error> {
        let Some(store) = self.fallback.as_mut() else {
            unreachable!("opened by the caller")
        };
        if let (Some(group), None) = (&self.group, self.fallback_group) {
            self.fallback_group = Some(store.insert_group(group)?);
        }
        insert(store, m, indexed, self.fallback_group, uuid, true)
    }
}

/// Saves a run into `store` under `uuid`, in `group`, marked `to_push` or not.
fn insert(
    store: &mut Store,
    m: &Measured,
    indexed: &Indexed<'_>,
    group: Option<GroupId>,
    uuid: Uuid,
    to_push: bool,
) -> Result<RunId, sonde_store::Error> {
    let document = sonde_report::render::json(&m.result);
    let labels: Vec<Label> = indexed
        .labels
        .iter()
        .map(|(key, value)| Label {
            key: key.clone(),
            value: value.clone(),
        })
        .collect();
    store.insert(&NewRun {
        time_unix_ms: indexed.time_unix_ms,
        test: indexed.test,
        protocol: indexed.protocol,
        server: Some(indexed.server),
        labels: &labels,
        group,
        interrupted: indexed.interrupted,
        headline: indexed.headline,
        document: &document,
        histograms: &m.histograms,
        uuid: Some(uuid),
        to_push,
    })
}

/// Runs `once` `--repeat` times, `--pause` apart, with one saver (so one group), then says
/// which group holds the runs: on stdout after tables, on stderr after JSON or CSV (which stay
/// documents and rows only).
pub(crate) fn repeat(
    opt: &SaveOpt,
    output: OutputOpt,
    mut once: impl FnMut(&mut Saver) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut saver = Saver::new(opt)?;
    if opt.repeat > 1 {
        saver.grouped("repeat");
    }
    for i in 0..opt.repeat {
        if i > 0 {
            if let Some(pause) = opt.pause {
                std::thread::sleep(pause);
            }
        }
        once(&mut saver)?;
    }
    if opt.repeat > 1 {
        let note = match saver.group() {
            Some((g, None)) => format!(
                "{} runs saved as group {g}: `sonde results --group {g}` lists them",
                opt.repeat
            ),
            Some((g, Some(local))) => format!(
                "{} runs saved as group {g} in {}, to push: `sonde results --db {} --group {g}` \
                 lists them",
                opt.repeat,
                local.display(),
                local.display()
            ),
            None => format!("{} runs, not saved", opt.repeat),
        };
        if output.exporter().is_for_people() {
            print(&format!("\n{note}\n"))?;
        } else {
            eprintln!("sonde: {note}");
        }
    }
    Ok(())
}

fn warn_not_saved(why: &str) {
    eprintln!("sonde: warning: the result was not saved: {why}");
}

/// What a run is found and listed by.
struct Indexed<'a> {
    time_unix_ms: u64,
    test: &'static str,
    protocol: Option<&'static str>,
    server: &'a str,
    labels: &'a Labels,
    interrupted: bool,
    headline: Headline,
}

impl<'a> Indexed<'a> {
    /// `None` for documents that are not one run (`quick`, a sweep, `conf`).
    fn of(result: &'a TestResult) -> Option<Self> {
        let index = result.kind().index()?;
        let h = index.headline;
        Some(Self {
            time_unix_ms: index.time_unix_ms,
            test: index.test,
            protocol: Some(match index.protocol {
                sonde_report::Protocol::Tcp => "tcp",
                sonde_report::Protocol::Udp => "udp",
            }),
            server: index.server,
            labels: index.labels,
            interrupted: index.interrupted,
            headline: Headline {
                rtt_mean_ns: h.rtt_mean_ns,
                rtt_p50_ns: h.rtt_p50_ns,
                rtt_p99_ns: h.rtt_p99_ns,
                rtt_p9999_ns: h.rtt_p9999_ns,
                bits_per_second: h.bits_per_second,
                packets_per_second: h.packets_per_second,
                connections_per_second: h.connections_per_second,
                loss_percent: h.loss_percent,
            },
        })
    }
}
