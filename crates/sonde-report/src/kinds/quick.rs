//! `sonde quick`: one result per case.

use crate::model::{CsvRow, Labels, QuickResult, ResultKind, RunPart, TestResult};
use crate::render::{csv, table};

impl ResultKind for QuickResult {
    fn test_name(&self) -> &'static str {
        "quick"
    }

    fn labels(&self) -> Option<&Labels> {
        Some(&self.labels)
    }

    fn set_labels(&mut self, labels: Labels) {
        self.labels = labels;
    }

    fn parts(&self) -> Vec<(String, &TestResult)> {
        self.results
            .iter()
            .map(|c| (c.case.clone(), &c.result))
            .collect()
    }

    fn runs(&self) -> Vec<RunPart> {
        self.results
            .iter()
            .map(|c| RunPart {
                name: c.case.clone(),
                labels: vec![("case".to_owned(), c.case.clone())],
                result: c.result.clone(),
                histogram: None,
            })
            .collect()
    }

    fn table(&self, out: &mut String) {
        table::quick::quick(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::quick::headline(self)
    }

    fn csv_has_case(&self) -> bool {
        true
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        &[
            &csv::LATENCY,
            &csv::THROUGHPUT,
            &csv::PPS,
            &csv::crr::COLUMNS,
        ]
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::quick_rows(self, case, rows);
    }
}
