//! `sonde latency`: round-trip times.

use crate::model::{CsvRow, Labels, LatencyResult, Meta, ResultKind};
use crate::render::{csv, table};

impl ResultKind for LatencyResult {
    fn test_name(&self) -> &'static str {
        "latency"
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

    fn table(&self, out: &mut String) {
        table::latency::latency(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::latency::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::LATENCY]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::latency_rows(self, case, rows);
    }
}
