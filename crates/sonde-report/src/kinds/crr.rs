//! `sonde crr`: connection rate.

use crate::compare::{Figure, Kind, Value};
use crate::model::{CrrResult, CsvRow, HeadlineFigures, Meta, ResultKind, RunIndex};
use crate::render::{csv, table};

/// How compare reads crr runs: connections per second (the agent's count, else the client's).
const COMPARED: Kind = Kind {
    rank: 3,
    name: "crr",
    cases_title: "Connection-rate cases",
    figures: &[Figure::ConnectionsPerSecond],
    matrix: &[Figure::ConnectionsPerSecond],
    cases: &[Figure::ConnectionsPerSecond],
};

impl ResultKind for CrrResult {
    fn test_name(&self) -> &'static str {
        "crr"
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
            "crr",
            self.protocol,
            HeadlineFigures {
                connections_per_second: self.connections_per_second,
                ..HeadlineFigures::default()
            },
        ))
    }

    fn compared(&self) -> Option<Kind> {
        Some(COMPARED)
    }

    fn figure(&self, figure: Figure) -> Value {
        match figure {
            Figure::ConnectionsPerSecond => self
                .connections_per_second
                .or(self.client_connections_per_second)
                .map_or(Value::Unsupported, Value::Known),
            _ => Value::Absent,
        }
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
