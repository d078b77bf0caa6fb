//! The JSON document.

use super::Exporter;
use crate::model::TestResult;
use crate::render;

/// [`render::json`]; repeated runs' documents follow each other.
pub(super) struct Json;

impl Exporter for Json {
    fn document(&self, result: &TestResult) -> String {
        render::json(result)
    }
}
