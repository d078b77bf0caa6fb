//! `--json-stream`: one JSON object a line, as iperf3 3.17's.

use super::Exporter;
use crate::model::TestResult;

/// The document as the stream's last line, `{"event":"end","data":DOCUMENT}`.
pub(super) struct JsonStream;

impl Exporter for JsonStream {
    fn document(&self, result: &TestResult) -> String {
        stream_line("end", result)
    }
}

/// One `--json-stream` line: `{"event":EVENT,"data":DATA}`, with its newline (an empty line if
/// `data` does not serialize, which a result always does).
pub fn stream_line(event: &str, data: &impl serde::Serialize) -> String {
    let mut s = serde_json::to_string(&serde_json::json!({ "event": event, "data": data }))
        .unwrap_or_default();
    s.push('\n');
    s
}
