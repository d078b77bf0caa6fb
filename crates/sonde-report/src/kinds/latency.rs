//! `sonde latency`: round-trip times.

use crate::compare::{Figure, Kind, Value};
use crate::model::{
    CsvRow, HeadlineFigures, Helpers, LatencyResult, Meta, Protocol, ResultKind, RttRun, RunIndex,
    ShareFigures,
};
use crate::render::{csv, table};

/// How compare reads latency runs: their RTTs, and their loss over UDP.
const COMPARED: Kind = Kind {
    rank: 0,
    name: "latency",
    cases_title: "Latency cases",
    figures: &[
        Figure::RttMean,
        Figure::RttP50,
        Figure::RttP99,
        Figure::RttP999,
        Figure::RttP9999,
        Figure::RttMax,
        Figure::Loss,
        Figure::TransactionsPerSecond,
    ],
    matrix: &[
        Figure::RttMean,
        Figure::RttP50,
        Figure::RttP99,
        Figure::RttP9999,
    ],
    cases: &[
        Figure::RttMean,
        Figure::RttP50,
        Figure::RttP99,
        Figure::RttP9999,
        Figure::RttMax,
    ],
};

impl ResultKind for LatencyResult {
    fn test_name(&self) -> &'static str {
        "latency"
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
            "latency",
            self.protocol,
            rtt_headline(self),
        ))
    }

    fn helpers(&self) -> Option<(&Helpers, ShareFigures)> {
        self.helpers.as_ref().map(|h| (h, ShareFigures::Latency))
    }

    fn compared(&self) -> Option<Kind> {
        Some(COMPARED)
    }

    fn figure(&self, figure: Figure) -> Value {
        let r = &self.rtt_ns;
        match figure {
            Figure::RttMean => Value::Known(r.mean),
            Figure::RttP50 => Value::stated(r.p50),
            Figure::RttP99 => Value::stated(r.p99),
            Figure::RttP999 => Value::stated(r.p999),
            Figure::RttP9999 => Value::stated(r.p9999),
            Figure::RttMax => Value::Known(r.max as f64),
            Figure::Loss => match self.protocol {
                Protocol::Udp if self.sent > 0 => {
                    Value::Known(self.lost as f64 * 100.0 / self.sent as f64)
                }
                _ => Value::Absent,
            },
            // Many-flow runs only: compare reads it when both runs have it.
            Figure::TransactionsPerSecond => self
                .request_response
                .as_ref()
                .map_or(Value::Absent, |rr| Value::Known(rr.transactions_per_second)),
            _ => Value::Absent,
        }
    }

    fn rtt(&self) -> Option<RttRun<'_>> {
        Some(RttRun {
            rtt_ns: &self.rtt_ns,
            samples: self.samples,
            measured_ns: self.duration_ns.saturating_sub(self.warmup_ns),
        })
    }

    fn table(&self, out: &mut String) {
        table::latency::latency(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::latency::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        // The many-flow columns only where there are many-flow figures: a one-flow run's CSV
        // is what it was.
        if self.request_response.is_some() {
            &[&csv::LATENCY, &csv::inner::COLUMNS, &csv::REQUEST_RESPONSE]
        } else {
            &[&csv::LATENCY, &csv::inner::COLUMNS]
        }
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::latency_rows(self, case, rows);
    }
}

/// A latency run's headline figures: its RTTs, and its loss over UDP.
pub(super) fn rtt_headline(r: &LatencyResult) -> HeadlineFigures {
    HeadlineFigures {
        rtt_mean_ns: (r.samples > 0).then_some(r.rtt_ns.mean),
        rtt_p50_ns: r.rtt_ns.p50,
        rtt_p99_ns: r.rtt_ns.p99,
        rtt_p9999_ns: r.rtt_ns.p9999,
        loss_percent: match r.protocol {
            Protocol::Udp => (r.sent > 0).then(|| r.lost as f64 * 100.0 / r.sent as f64),
            Protocol::Tcp => None,
        },
        ..HeadlineFigures::default()
    }
}
