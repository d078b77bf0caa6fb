//! `sonde conf`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::Hosts;
use super::meta::{Warning, WarningCode};

/// `sonde conf [HOST]`: this host's configuration and, with a host, the agent's, as a test
/// between them would see them (the interfaces that face each other).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfResult {
    /// sonde's version.
    pub sonde_version: String,
    /// When it was collected, milliseconds since the Unix epoch.
    pub timestamp_unix_ms: u64,
    /// The agent asked, as the client reached it; `null` for this host alone.
    pub server: Option<String>,
    /// This host (`client`) and the agent (`server`; `null` without a host, or from an agent
    /// too old to say).
    pub hosts: Hosts,
    /// What the reader must know (an agent that did not report its configuration).
    pub warnings: Vec<String>,
    /// What each of `warnings` is about, in the same order (as in a test's result). Add
    /// warnings with [`ConfResult::add`], which keeps the two in step.
    #[serde(default)]
    pub warning_codes: Vec<WarningCode>,
}

impl ConfResult {
    /// Adds a typed warning: its text and its code, side by side.
    pub fn add(&mut self, warning: &Warning) {
        self.warnings.push(warning.to_string());
        self.warning_codes.push(warning.code());
    }
}
