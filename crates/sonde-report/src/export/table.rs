//! The table for people.

use super::Exporter;
use crate::compare::{CaseTable, Comparison};
use crate::model::TestResult;
use crate::render;

/// [`render::table`]; a repeated run's table follows a blank line.
pub(super) struct Table;

impl Exporter for Table {
    fn document(&self, result: &TestResult) -> String {
        render::table(result)
    }

    fn next_document(&self, result: &TestResult) -> String {
        format!("\n{}", render::table(result))
    }

    fn comparison(&self, c: &Comparison) -> String {
        render::compare_table(c)
    }

    fn matrix(&self, tables: &[CaseTable]) -> String {
        render::matrix_table(tables)
    }

    fn is_for_people(&self) -> bool {
        true
    }
}
