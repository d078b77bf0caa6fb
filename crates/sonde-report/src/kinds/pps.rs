//! `sonde pps`: packet rate.

use crate::compare::{Figure, Kind, Value};
use crate::model::{
    CsvRow, HeadlineFigures, Helpers, Meta, PpsResult, ResultKind, RunIndex, ShareFigures,
};
use crate::render::{csv, table};

/// How compare reads pps runs: packets received per second, and loss.
const COMPARED: Kind = Kind {
    rank: 2,
    name: "pps",
    cases_title: "Packet-rate cases",
    figures: &[Figure::Pps, Figure::Loss],
    matrix: &[Figure::Pps, Figure::Loss],
    cases: &[Figure::Pps, Figure::Loss],
};

impl ResultKind for PpsResult {
    fn test_name(&self) -> &'static str {
        "pps"
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
            "pps",
            self.protocol,
            HeadlineFigures {
                packets_per_second: Some(self.received_pps),
                loss_percent: Some(self.loss_percent),
                ..HeadlineFigures::default()
            },
        ))
    }

    fn helpers(&self) -> Option<(&Helpers, ShareFigures)> {
        self.helpers.as_ref().map(|h| (h, ShareFigures::Pps))
    }

    fn clear_intervals(&mut self) {
        self.intervals.clear();
    }

    fn compared(&self) -> Option<Kind> {
        Some(COMPARED)
    }

    fn figure(&self, figure: Figure) -> Value {
        match figure {
            Figure::Pps => Value::Known(self.received_pps),
            Figure::Loss => Value::Known(self.loss_percent),
            _ => Value::Absent,
        }
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
