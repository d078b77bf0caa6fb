//! `sonde throughput`: bulk transfer.

use crate::model::{
    CsvRow, HeadlineFigures, Helpers, Meta, ResultKind, RunIndex, ShareFigures, ThroughputResult,
};
use crate::render::{csv, table};

impl ResultKind for ThroughputResult {
    fn test_name(&self) -> &'static str {
        "throughput"
    }

    fn meta(&self) -> Option<&Meta> {
        Some(&self.meta)
    }

    fn meta_mut(&mut self) -> Option<&mut Meta> {
        Some(&mut self.meta)
    }

    fn has_streams(&self) -> bool {
        true
    }

    fn index(&self) -> Option<RunIndex<'_>> {
        Some(RunIndex::of(
            &self.meta,
            "throughput",
            self.protocol,
            HeadlineFigures {
                bits_per_second: Some(self.receiver.bits_per_second),
                loss_percent: self.loss_percent,
                ..HeadlineFigures::default()
            },
        ))
    }

    fn helpers(&self) -> Option<(&Helpers, ShareFigures)> {
        self.helpers.as_ref().map(|h| (h, ShareFigures::Throughput))
    }

    fn table(&self, out: &mut String) {
        table::throughput::throughput(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::throughput::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::THROUGHPUT]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::throughput_rows(self, case, rows);
    }
}
