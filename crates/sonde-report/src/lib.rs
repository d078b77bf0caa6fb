//! sonde's result model (the JSON contract, with its JSON Schema) and pure renderers: a table for
//! people, JSON and CSV for programs. Renderers take a result and return text; they never print.
//!
//! - [`model`]: the documents. Field names carry their units; unmeasurable values are `null`.
//! - [`render`]: [`render::table`], [`render::json`], [`render::csv`] (also
//!   [`render::csv_header`] and [`render::csv_rows`] to append runs to one file).
//! - [`ResultKind`]: what every consumer asks of a result, one trait each test kind implements;
//!   [`TestResult::kind`] is the one dispatch over the kinds.
//! - [`export`]: the output formats behind one [`export::Exporter`] trait, one module per format.
//! - [`compare`]: runs against runs (`sonde compare`), and the matrix and case tables.
//! - [`json_schema`]: [`schema()`] generated from the model, committed at
//!   `schema/sonde-result.schema.json`, and `validate()` (feature `schema-validate`).
//!
//! This crate does not measure, read clocks or touch sockets.
//!
//! ```
//! use sonde_report::{render, TestResult};
//!
//! // A result as the client produces it, here read back from its JSON document.
//! let doc = r#"{
//!   "test": "latency",
//!   "sonde_version": "0.1.0", "timestamp_unix_ms": 1714564800000,
//!   "server": "192.0.2.10:5300", "session": 7, "overlapping_sessions": 0, "warnings": [],
//!   "protocol": "tcp", "mode": "closed_loop", "rate_per_second": null, "msg_size_bytes": 64,
//!   "duration_ns": 2000000000, "warmup_ns": 0, "warmup_samples": 0, "sent": 5000, "samples": 5000,
//!   "rtt_ns": { "min": 31000, "mean": 39870.4, "stddev": 4310.7, "p50": 38911, "p90": 44031,
//!               "p99": 57343, "p999": null, "p9999": null, "p99999": null, "max": 120000 },
//!   "lost": 0, "lost_outbound": null, "lost_return": null, "duplicated": 0, "reordered": 0,
//!   "late_sends": null
//! }"#;
//! let result: TestResult = serde_json::from_str(doc)?;
//!
//! let table = render::table(&result);
//! assert!(table.starts_with("sonde 0.1.0 latency: server 192.0.2.10:5300, session 7, "));
//! assert!(table.contains("\nRTT (round trip), not one-way latency\n"));
//! let row = |name: &str| table.lines().find(|l| l.trim_start().starts_with(name)).unwrap();
//! assert!(row("p50 ").ends_with(" 38.91 µs"));
//! assert!(row("p99.9 ").ends_with(" n/a (needs ≥10,000 samples)"));
//!
//! let csv = render::csv(&result);
//! assert!(csv.starts_with("test,row,sonde_version,"));
//! assert_eq!(csv.lines().count(), 2); // header + the summary row
//!
//! // The JSON rendering is the document, and the schema accepts it.
//! let again: serde_json::Value = serde_json::from_str(&render::json(&result))?;
//! assert_eq!(again["rtt_ns"]["p50"], 38911);
//! assert_eq!(sonde_report::schema()["title"], "TestResult");
//! # Ok::<(), serde_json::Error>(())
//! ```
#![forbid(unsafe_code)]

pub mod compare;
pub mod export;
pub mod json_schema;
mod kinds;
pub mod model;
pub mod render;
pub mod samples;

#[cfg(test)]
mod fixtures;

#[cfg(feature = "schema-validate")]
pub use json_schema::validate;
pub use json_schema::{schema, schema_pretty};
pub use model::*;
