//! `sonde throughput`: bulk transfer.

use crate::compare::{Figure, Kind, Value};
use crate::model::{
    CsvRow, HeadlineFigures, Helpers, Meta, Protocol, ResultKind, RunIndex, ShareFigures,
    ThroughputResult,
};
use crate::render::{csv, table};

/// How compare reads throughput runs: the receiver's rate, and over UDP its packets and loss.
const COMPARED: Kind = Kind {
    rank: 1,
    name: "throughput",
    cases_title: "Throughput cases",
    figures: &[Figure::Throughput, Figure::Pps, Figure::Loss],
    matrix: &[Figure::Throughput, Figure::Pps, Figure::Loss],
    cases: &[Figure::Throughput, Figure::Pps, Figure::Loss],
};

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

    fn clear_intervals(&mut self) {
        self.intervals.clear();
    }

    fn compared(&self) -> Option<Kind> {
        Some(COMPARED)
    }

    fn figure(&self, figure: Figure) -> Value {
        match figure {
            Figure::Throughput => Value::Known(self.receiver.bits_per_second),
            Figure::Pps => {
                let duration_s = self.receiver.duration_ns as f64 / 1e9;
                match self.protocol {
                    Protocol::Udp if duration_s > 0.0 => {
                        Value::Known(self.receiver.packets as f64 / duration_s)
                    }
                    _ => Value::Absent,
                }
            }
            Figure::Loss => self.loss_percent.map_or(Value::Absent, Value::Known),
            _ => Value::Absent,
        }
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
