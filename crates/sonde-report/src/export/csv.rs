//! CSV.

use super::Exporter;
use crate::model::TestResult;
use crate::render;

/// [`render::csv`]; a repeated run's rows go under the first run's header.
pub(super) struct Csv;

impl Exporter for Csv {
    fn document(&self, result: &TestResult) -> String {
        render::csv(result)
    }

    fn next_document(&self, result: &TestResult) -> String {
        render::csv_rows(result)
    }
}
