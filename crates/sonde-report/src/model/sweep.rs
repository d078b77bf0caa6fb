//! `--sweep`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Labels;
use super::TestResult;

/// `--sweep PARAM=VALUES`: the same test run once per value of one parameter, in order, so a
/// reader sees where bandwidth stops growing or latency starts to climb.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When the sweep started, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// `--label KEY=VALUE` as given (each step's own labels add the parameter and its value).
    #[serde(default)]
    pub labels: Labels,
    /// The test swept: `latency`, `throughput` or `pps`.
    pub sweep_test: String,
    /// The parameter varied: `msg_size`, `parallel`, `rate`, `bitrate` or `depth`.
    pub parameter: String,
    /// The parameter's unit: `bytes`, `streams`, `messages_per_second`, `bits_per_second` or
    /// `requests_in_flight`.
    pub unit: String,
    /// One run per value, in the order run.
    pub steps: Vec<SweepStep>,
}

/// One step of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepStep {
    /// The parameter's value in this run, in the sweep's `unit`.
    pub value: u64,
    /// The run's full result.
    pub result: TestResult,
}
