//! `--sweep`: one result per step.

use crate::model::{CsvRow, Labels, ResultKind, RunPart, SweepResult, TestResult};
use crate::render::{csv, table};

impl ResultKind for SweepResult {
    fn test_name(&self) -> &'static str {
        "sweep"
    }

    fn labels(&self) -> Option<&Labels> {
        Some(&self.labels)
    }

    fn set_labels(&mut self, labels: Labels) {
        self.labels = labels;
    }

    fn parts(&self) -> Vec<(String, &TestResult)> {
        self.steps
            .iter()
            .map(|s| (format!("{}={}", self.parameter, s.value), &s.result))
            .collect()
    }

    fn runs(&self) -> Vec<RunPart> {
        self.steps
            .iter()
            .map(|s| {
                let value = s.value.to_string();
                RunPart {
                    name: format!("{}={value}", self.parameter),
                    labels: vec![(self.parameter.clone(), value)],
                    result: s.result.clone(),
                    histogram: None,
                }
            })
            .collect()
    }

    fn table(&self, out: &mut String) {
        table::sweep::sweep(self, out);
    }

    fn headline(&self) -> (String, String) {
        table::sweep::headline(self)
    }

    fn csv_has_case(&self) -> bool {
        true
    }

    fn csv_columns(&self) -> &'static [&'static [&'static str]] {
        match self.sweep_test.as_str() {
            "latency" => &[&csv::LATENCY, &csv::inner::COLUMNS],
            "throughput" => &[&csv::THROUGHPUT],
            "pps" => &[&csv::PPS],
            _ => &[&csv::LATENCY, &csv::THROUGHPUT, &csv::PPS],
        }
    }

    fn csv_rows(&self, case: Option<&str>, rows: &mut Vec<CsvRow>) {
        csv::sweep_rows(self, case, rows);
    }
}
