//! Renderers: pure functions from a result to text. They never print and never fail.
//!
//! - [`table`]: for people. Rates in SI units (1 Mbit/s = 10^6 bit/s), bytes in binary units
//!   (1 MiB = 2^20 B), one unit per column; RTTs in µs (ms from a 1 ms median).
//! - [`json`]: the document itself, pretty-printed: the contract programs should read.
//! - [`csv`] ([`csv_header`] + [`csv_rows`]): one `summary` row per run, plus `stream`,
//!   `interval` and `flow` rows; units in the column names ([`csv_columns`]), an unknown value
//!   is an empty cell.
//! - [`html`]: `sonde report`, one self-contained HTML file with tables and charts.
//! - [`compare_table`], [`matrix_table`] (and their JSON): `sonde compare` and its `--by` view.
//! - [`diagnosis`]: `sonde mesh diagnose` as text, JSON and one HTML page of heatmaps.

mod axes;
mod compare;
pub(crate) mod csv;
pub mod diagnosis;
mod html;
pub(crate) mod table;
mod units;

pub use self::axes::{label_keys, Layout};
pub use self::compare::{compare_json, compare_table, matrix_json, matrix_table};
pub use self::csv::{csv, csv_columns, csv_header, csv_rows};
pub use self::html::{html, Report};
pub use self::table::{interval_line, latency_interval_line, pps_interval_line, table};
use crate::model::TestResult;

/// The document as pretty JSON (two-space indent, fields in model order), with a trailing
/// newline.
///
/// A non-finite `f64` (NaN, infinity) comes out as `null`, which neither the schema nor the
/// model's deserializer accepts: producers must not put one in a result.
pub fn json(result: &TestResult) -> String {
    // Cannot fail: the model has no map with non-string keys and no fallible Serialize impl.
    let mut s = serde_json::to_string_pretty(result).expect("the result model always serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn json_is_the_document_and_reads_back_exactly() {
        for (name, r) in fixtures::all() {
            let text = json(&r);
            assert!(
                text.starts_with("{\n  \"test\": ") && text.ends_with("}\n"),
                "{name}"
            );
            let back: TestResult = serde_json::from_str(&text).expect(name);
            assert_eq!(
                back, r,
                "{name}: the JSON does not read back as the same result"
            );
        }
    }

    macro_rules! snapshots {
        ($($fixture:ident),* $(,)?) => {$(
            #[test]
            fn $fixture() {
                let r = fixtures::$fixture();
                // All of the crate's snapshots in one place: src/snapshots.
                insta::with_settings!({ snapshot_path => "../snapshots" }, {
                    insta::assert_snapshot!(concat!(stringify!($fixture), "_table"), table(&r));
                    insta::assert_snapshot!(concat!(stringify!($fixture), "_json"), json(&r));
                    insta::assert_snapshot!(concat!(stringify!($fixture), "_csv"), csv(&r));
                });
            }
        )*};
    }

    snapshots!(
        latency_tcp,
        latency_udp_lossy,
        throughput_tcp_2_streams,
        throughput_udp_reverse,
        throughput_bidir,
        pps_2_flows,
        pps_intervals,
        crr_4_workers,
        crr_ports_exhausted,
        quick_all,
        latency_with_warnings,
        latency_inner_view,
        load_udp_bufferbloat,
        sweep_latency_msg_size,
        throughput_tcp_context,
        conf_two_hosts,
        conf_this_host,
        pps_from_helpers,
        throughput_from_helpers,
        latency_from_helpers,
        mtu_router_said,
        latency_many_flows,
        latency_many_flows_open,
    );
}
