//! `sonde quick`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Labels;
use super::TestResult;

/// `sonde quick`: the embedded default's results, one per case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuickResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the run started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `--label KEY=VALUE` as given (each case's own labels add `case`).
    #[serde(default)]
    pub labels: Labels,
    /// The cases, in the order run.
    pub results: Vec<QuickCase>,
}

/// One case of `sonde quick`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QuickCase {
    /// Short name (`tcp latency`, `tcp throughput x2`...).
    pub case: String,
    /// The result.
    pub result: TestResult,
}
