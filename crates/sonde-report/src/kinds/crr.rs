//! `sonde crr`: connection rate.

use crate::model::{CrrResult, CsvRow, Labels, Meta, ResultKind};
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
