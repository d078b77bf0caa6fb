//! `sonde mtu`: the path MTU and the TCP MSS at each end.

use crate::model::{CsvRow, HeadlineFigures, Meta, MtuResult, Protocol, ResultKind, RunIndex};
use crate::render::{csv, table};

impl ResultKind for MtuResult {
    fn test_name(&self) -> &'static str {
        "mtu"
    }

    fn meta(&self) -> Option<&Meta> {
        Some(&self.meta)
    }

    fn meta_mut(&mut self) -> Option<&mut Meta> {
        Some(&mut self.meta)
    }

    fn index(&self) -> Option<RunIndex<'_>> {
        Some(RunIndex::of(
            &self.meta,
            "mtu",
            Protocol::Udp,
            HeadlineFigures::default(),
        ))
    }

    fn table(&self, out: &mut String) {
        table::mtu::mtu(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::mtu::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::MTU_COLUMNS]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::mtu_rows(self, case, rows);
    }
}
