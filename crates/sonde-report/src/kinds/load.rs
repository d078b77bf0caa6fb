//! `sonde load`: latency idle and under load.

use crate::model::{
    CsvRow, HeadlineFigures, Labels, LoadResult, Meta, ResultKind, RunIndex, RunPart, TestResult,
};
use crate::render::{csv, table};

impl ResultKind for LoadResult {
    fn test_name(&self) -> &'static str {
        "load"
    }

    fn labels(&self) -> Option<&Labels> {
        Some(&self.labels)
    }

    fn set_labels(&mut self, labels: Labels) {
        self.idle.meta.labels.clone_from(&labels);
        self.loaded.meta.labels.clone_from(&labels);
        self.load.meta.labels.clone_from(&labels);
        self.labels = labels;
    }

    fn metas(&self) -> Vec<(String, &Meta)> {
        vec![
            ("idle".to_owned(), &self.idle.meta),
            ("loaded".to_owned(), &self.loaded.meta),
            ("load".to_owned(), &self.load.meta),
        ]
    }

    /// Its phases, labelled `phase=idle`, `loaded` and `load`, each with the load's labels too.
    fn runs(&self) -> Vec<RunPart> {
        let part = |phase: &str, result: TestResult, histogram: Option<&'static str>| {
            let mut labels = vec![("phase".to_owned(), phase.to_owned())];
            labels.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            RunPart {
                name: phase.to_owned(),
                labels,
                result,
                histogram,
            }
        };
        vec![
            part(
                "idle",
                TestResult::Latency(self.idle.clone()),
                Some("idle_rtt"),
            ),
            part(
                "loaded",
                TestResult::Latency(self.loaded.clone()),
                Some("loaded_rtt"),
            ),
            part("load", TestResult::Throughput(self.load.clone()), None),
        ]
    }

    fn has_streams(&self) -> bool {
        true
    }

    fn interrupted(&self) -> bool {
        self.idle.meta.interrupted || self.loaded.meta.interrupted
    }

    /// The loaded probes are the figure of a load test; the load's rate beside them.
    fn index(&self) -> Option<RunIndex<'_>> {
        Some(RunIndex {
            time_unix_ms: self.timestamp_unix_ms,
            test: "load",
            protocol: self.loaded.protocol,
            server: &self.loaded.meta.server,
            labels: &self.labels,
            interrupted: self.interrupted(),
            headline: HeadlineFigures {
                bits_per_second: Some(self.load.receiver.bits_per_second),
                ..super::latency::rtt_headline(&self.loaded)
            },
        })
    }

    fn table(&self, out: &mut String) {
        table::load::load(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::load::headline(self)
    }

    fn csv_has_case(&self) -> bool {
        true
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::LATENCY, &csv::THROUGHPUT]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::load_rows(self, case, rows);
    }
}
