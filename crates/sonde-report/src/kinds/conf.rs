//! `sonde conf`: both ends' configuration.

use crate::model::{ConfResult, CsvRow, ResultKind};
use crate::render::{csv, table};

impl ResultKind for ConfResult {
    fn test_name(&self) -> &'static str {
        "conf"
    }

    fn table(&self, out: &mut String) {
        table::context::conf(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::context::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[]
    }

    fn csv_rows(&self, _case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::context::conf_rows(self, rows);
    }
}
