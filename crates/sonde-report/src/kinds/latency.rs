//! `sonde latency`: round-trip times.

use crate::model::{
    CsvRow, HeadlineFigures, Helpers, LatencyResult, Meta, Protocol, ResultKind, RunIndex,
    ShareFigures,
};
use crate::render::{csv, table};

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

    fn table(&self, out: &mut String) {
        table::latency::latency(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::latency::headline(self)
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[&csv::LATENCY, &csv::inner::COLUMNS]
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
