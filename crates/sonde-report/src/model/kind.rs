//! What every consumer asks of a result, whatever its kind: [`ResultKind`], implemented beside
//! each kind's document, and [`TestResult::kind`], the one dispatch over the variants. A new
//! kind implements the trait in its own module (`kinds/`) and registers its document in one
//! line of `model/mod.rs`'s `test_results!`, which declares the variant and the dispatch.

use std::collections::BTreeMap;

use super::context::{Helpers, ShareFigures};
use super::index::RunIndex;
use super::meta::{Labels, Meta};
use super::stats::RttNs;
use super::TestResult;
use crate::compare::{self, Figure};

/// One CSV row: its cells by column name (a column it has no cell for is empty).
pub type CsvRow = BTreeMap<&'static str, String>;

/// A latency run's round trips, as compare and the HTML report read them
/// ([`ResultKind::rtt`]).
#[derive(Debug, Clone, Copy)]
pub struct RttRun<'a> {
    /// Its RTT statistics.
    pub rtt_ns: &'a RttNs,
    /// The samples behind them.
    pub samples: u64,
    /// The time they were taken over: the run's duration without its warm-up, ns.
    pub measured_ns: u64,
}

/// One of the single runs a result is made of, as compare and the report take it apart
/// ([`ResultKind::runs`]).
#[derive(Debug, Clone)]
pub struct RunPart {
    /// Its name within the result: a quick case, a sweep step (`PARAM=VALUE`), a load phase.
    pub name: String,
    /// The labels it takes where it has none of its own, in order: first the one that tells it
    /// from the others (`case=NAME`, `PARAM=VALUE`, `phase=idle`), then any the whole result
    /// lends it.
    pub labels: Vec<(String, String)>,
    /// Its document.
    pub result: TestResult,
    /// The name sonde-store saves its RTT histogram under, for a load's latency phases
    /// (`idle_rtt`, `loaded_rtt`).
    pub histogram: Option<&'static str>,
}

/// One test kind's result, as the renderers, the compare and the results store see it.
pub trait ResultKind {
    /// The document's `test` tag (`latency`, `throughput`, ...).
    fn test_name(&self) -> &'static str;

    /// The common facts of a single run; `None` for a kind made of several runs (quick, load,
    /// sweep), each with its own, and for conf.
    fn meta(&self) -> Option<&Meta> {
        None
    }

    /// [`meta`](Self::meta), to change.
    fn meta_mut(&mut self) -> Option<&mut Meta> {
        None
    }

    /// `--label`: the labels the document carries (a single run's are its meta's); `None` for a
    /// kind that carries none (conf).
    fn labels(&self) -> Option<&Labels> {
        self.meta().map(|m| &m.labels)
    }

    /// Puts `labels` in the document, in each of its runs' metas too; a kind that carries none
    /// ignores them.
    fn set_labels(&mut self, labels: Labels) {
        if let Some(meta) = self.meta_mut() {
            meta.labels = labels;
        }
    }

    /// The metas it holds itself, each with the part it belongs to (empty for a single run);
    /// not those of the results in [`parts`](Self::parts).
    fn metas(&self) -> Vec<(String, &Meta)> {
        self.meta()
            .map(|m| vec![(String::new(), m)])
            .unwrap_or_default()
    }

    /// The whole results it is made of, each with its part's name (a quick case, a sweep step
    /// `PARAM=VALUE`); empty for a single run.
    fn parts(&self) -> Vec<(String, &TestResult)> {
        Vec::new()
    }

    /// The single runs it is made of, each a whole document (a quick case, a sweep step, a
    /// load's idle and loaded probes and its load), for compare and the report; empty for a
    /// single run.
    fn runs(&self) -> Vec<RunPart> {
        Vec::new()
    }

    /// `--from`: its helpers' shares and which figures they have; not those of its parts.
    fn helpers(&self) -> Option<(&Helpers, ShareFigures)> {
        None
    }

    /// Whether it holds a throughput run itself (streams, `TCP_INFO`), not counting its parts.
    fn has_streams(&self) -> bool {
        false
    }

    /// Stopped before its time (Ctrl-C, SIGTERM): its run, or any of its probe runs.
    fn interrupted(&self) -> bool {
        self.meta().is_some_and(|m| m.interrupted)
    }

    /// What a results store finds and lists it by; `None` for a document that is not one run
    /// (quick, a sweep, conf).
    fn index(&self) -> Option<RunIndex<'_>> {
        None
    }

    /// Warnings it carries outside any meta (conf's own); a meta's are in
    /// [`metas`](Self::metas).
    fn own_warnings(&self) -> &[String] {
        &[]
    }

    /// Drops its intervals, for a kind that has them (a helper's document, sent whole to its
    /// requester, which does not merge them).
    fn clear_intervals(&mut self) {}

    /// How `sonde compare` reads this kind: its name, the figures it offers, its matrix and case
    /// tables' columns; `None` for a kind compare does not read (quick, load, sweep, conf).
    fn compared(&self) -> Option<compare::Kind> {
        None
    }

    /// Its value of `figure` for `sonde compare`: [`compare::Value::Absent`] for a figure it
    /// does not have (every figure, for a kind compare does not read).
    fn figure(&self, _figure: Figure) -> compare::Value {
        compare::Value::Absent
    }

    /// The round trips it measured itself, for a latency run; `None` for any other kind (and
    /// for those that hold latency runs as parts: load, quick, a sweep).
    fn rtt(&self) -> Option<RttRun<'_>> {
        None
    }

    /// Its table for people ([`render::table`](crate::render::table)), appended to `out`.
    fn table(&self, out: &mut String);

    /// Its line in quick's table: the figure to quote, and its context.
    fn headline(&self) -> (String, String);

    /// Whether its CSV rows start with a `case` column (it holds several runs).
    fn csv_has_case(&self) -> bool {
        false
    }

    /// The column sets of its own CSV figures (its inner view's too), in order; the context's
    /// follow ([`render::csv_columns`](crate::render::csv_columns)).
    fn csv_columns(&self) -> &'static [&'static [&'static str]];

    /// Its CSV rows, appended to `rows`; `case` names the part it is of a bigger result.
    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>);
}

impl TestResult {
    /// The `test` tag: `latency`, `throughput`, `pps`, `quick` or `load`.
    pub fn test_name(&self) -> &'static str {
        self.kind().test_name()
    }

    /// The common facts; `None` for quick, load and sweep, whose runs each have their own.
    pub fn meta(&self) -> Option<&Meta> {
        self.kind().meta()
    }
}

#[cfg(test)]
mod tests {
    use crate::fixtures;
    use crate::model::Labels;

    #[test]
    fn each_kind_says_its_tag_and_only_single_runs_are_indexed() {
        for (name, r) in fixtures::all() {
            let doc = serde_json::to_value(&r).expect(name);
            assert_eq!(doc["test"], r.test_name(), "{name}");
            let one_run = matches!(
                r.test_name(),
                "latency" | "throughput" | "pps" | "crr" | "load" | "mtu"
            );
            let index = r.kind().index();
            assert_eq!(index.is_some(), one_run, "{name}");
            if let Some(i) = index {
                assert_eq!(i.test, r.test_name(), "{name}");
                assert_eq!(i.interrupted, r.kind().interrupted(), "{name}");
            }
        }
    }

    #[test]
    fn labels_set_are_the_labels_read_in_every_meta() {
        for (name, mut r) in fixtures::all() {
            let labels = Labels::from([("path".to_owned(), "private".to_owned())]);
            r.kind_mut().set_labels(labels.clone());
            match r.kind().labels() {
                Some(l) => assert_eq!(l, &labels, "{name}"),
                None => assert_eq!(r.test_name(), "conf", "{name}"),
            }
            for (part, meta) in r.kind().metas() {
                assert_eq!(meta.labels, labels, "{name} {part}");
            }
        }
    }
}
