//! `sonde conf`: both ends' configuration.

use crate::model::{ConfResult, CsvRow, ResultKind};
use crate::render::{csv, table};

impl ResultKind for ConfResult {
    fn test_name(&self) -> &'static str {
        "conf"
    }

    fn own_warnings(&self) -> &[String] {
        &self.warnings
    }

    fn table(&self, out: &mut String) {
        table::context::conf(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::context::headline(self)
    }

    /// Its figures are both ends' configuration.
    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::context::CONF]
    }

    fn csv_rows(&self, _case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::context::conf_rows(self, rows);
    }
}
