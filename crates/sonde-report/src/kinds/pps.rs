//! `sonde pps`: packet rate.

use crate::model::{
    CsvRow, HeadlineFigures, Helpers, Labels, Meta, PpsResult, ResultKind, RunIndex, ShareFigures,
};
use crate::render::{csv, table};

impl ResultKind for PpsResult {
    fn test_name(&self) -> &'static str {
        "pps"
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
            test: "pps",
            protocol: self.protocol,
            server: &self.meta.server,
            labels: &self.meta.labels,
            interrupted: self.meta.interrupted,
            headline: HeadlineFigures {
                packets_per_second: Some(self.received_pps),
                loss_percent: Some(self.loss_percent),
                ..HeadlineFigures::default()
            },
        })
    }

    fn helpers(&self) -> Option<(&Helpers, ShareFigures)> {
        self.helpers.as_ref().map(|h| (h, ShareFigures::Pps))
    }

    fn table(&self, out: &mut String) {
        table::pps::pps(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::pps::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::PPS]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::pps_rows(self, case, rows);
    }
}
