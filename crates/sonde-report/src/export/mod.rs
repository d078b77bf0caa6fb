//! Output formats behind one trait (hyperfine's `export` is the model): [`Exporter`], one
//! module per format, and [`exporter`], which picks one from a [`Format`]. A program picks its
//! exporter once, from its flags, and hands it every document it prints.
//!
//! ```
//! use sonde_report::export::{exporter, Format};
//! # let doc = include_str!("../snapshots/sonde_report__render__tests__latency_tcp_json.snap");
//! # let doc = &doc[doc.find("\n---\n").unwrap() + 5..];
//! let result: sonde_report::TestResult = serde_json::from_str(doc)?;
//! let csv = exporter(Format::Csv);
//! assert!(csv.document(&result).starts_with("test,row,"));
//! assert!(!csv.is_for_people());
//! # Ok::<(), serde_json::Error>(())
//! ```

mod csv;
mod json;
mod json_stream;
mod table;

pub use self::json_stream::stream_line;

use crate::compare::{CaseTable, Comparison};
use crate::model::TestResult;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A table for people ([`render::table`](crate::render::table)).
    Table,
    /// The JSON document ([`render::json`](crate::render::json)).
    Json,
    /// CSV: a header, then rows ([`render::csv`](crate::render::csv)).
    Csv,
    /// `--json-stream`: one JSON object a line, `{"event":"end","data":DOCUMENT}` at the end.
    JsonStream,
}

/// One output format: how it prints a result, a run after others, and a comparison.
pub trait Exporter {
    /// One result, whole, ending in a newline.
    fn document(&self, result: &TestResult) -> String;

    /// A result after others in the same output (`--repeat`): by default its whole document
    /// again, one after another.
    fn next_document(&self, result: &TestResult) -> String {
        self.document(result)
    }

    /// `sonde compare`'s comparison. A format without one of its own gives the JSON.
    fn comparison(&self, c: &Comparison) -> String {
        crate::render::compare_json(c)
    }

    /// `sonde compare --by`'s tables. A format without them gives the JSON.
    fn matrix(&self, tables: &[CaseTable]) -> String {
        crate::render::matrix_json(tables)
    }

    /// Whether the output is for people (a table): notes go to stdout beside it; for programs
    /// (JSON, CSV), stdout holds the documents only.
    fn is_for_people(&self) -> bool {
        false
    }
}

/// The exporter of `format`.
pub fn exporter(format: Format) -> &'static dyn Exporter {
    match format {
        Format::Table => &table::Table,
        Format::Json => &json::Json,
        Format::Csv => &csv::Csv,
        Format::JsonStream => &json_stream::JsonStream,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn each_format_prints_what_its_renderer_does() {
        for (name, r) in fixtures::all() {
            assert_eq!(
                exporter(Format::Table).document(&r),
                crate::render::table(&r),
                "{name}"
            );
            assert_eq!(
                exporter(Format::Json).document(&r),
                crate::render::json(&r),
                "{name}"
            );
            assert_eq!(
                exporter(Format::Csv).document(&r),
                crate::render::csv(&r),
                "{name}"
            );
            // A repeated run: CSV rows under the first header, tables a blank line apart.
            assert_eq!(
                exporter(Format::Csv).next_document(&r),
                crate::render::csv_rows(&r),
                "{name}"
            );
            assert_eq!(
                exporter(Format::Table).next_document(&r),
                format!("\n{}", crate::render::table(&r)),
                "{name}"
            );
            let line = exporter(Format::JsonStream).document(&r);
            let v: serde_json::Value = serde_json::from_str(&line).expect(name);
            assert_eq!(v["event"], "end", "{name}");
            assert_eq!(
                serde_json::from_value::<TestResult>(v["data"].clone()).expect(name),
                r,
                "{name}"
            );
            assert!(line.ends_with("}\n") && line.lines().count() == 1, "{name}");
        }
        assert!(exporter(Format::Table).is_for_people());
        for f in [Format::Json, Format::Csv, Format::JsonStream] {
            assert!(!exporter(f).is_for_people(), "{f:?}");
        }
    }
}
