//! `sonde crr`: connection rate.

use crate::model::{CrrResult, CsvRow, HeadlineFigures, Labels, Meta, ResultKind, RunIndex};
use crate::render::{csv, table};

impl ResultKind for CrrResult {
    fn test_name(&self) -> &'static str {
        "crr"
    }

    fn meta(&self) -> Option<&Meta> {
        Some(&self.meta)
    }

    fn labels(&self) -> Option<&Labels> {
        Some(&self.meta.labels)
    }

    fn set_labels(&mut self, labels: Labels) {
        self.meta.labels = labels;
    }

    fn index(&self) -> Option<RunIndex<'_>> {
        Some(RunIndex {
            time_unix_ms: self.meta.timestamp_unix_ms,
            test: "crr",
            protocol: self.protocol,
            server: &self.meta.server,
            labels: &self.meta.labels,
            interrupted: self.meta.interrupted,
            headline: HeadlineFigures {
                connections_per_second: self.connections_per_second,
                ..HeadlineFigures::default()
            },
        })
    }

    fn table(&self, out: &mut String) {
        table::crr::crr(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::crr::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::crr::COLUMNS]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::crr_rows(self, case, rows);
    }
}
