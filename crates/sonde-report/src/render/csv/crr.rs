//! The `sonde crr` columns: one summary row per run, then one `interval` row per interval
//! (`-i`), in the summary's columns for the same figures.

use super::{num_f64, opt, opt_f64, protocol, Row};
use crate::model::{CrrClose, CrrErrors, CrrResult, RttNs};

/// The columns of a crr run, after the common head.
pub(crate) const COLUMNS: [&str; 42] = [
    "protocol",
    "workers",
    "request_bytes",
    "response_bytes",
    "close",
    "duration_ns",
    "interval_start_ns",
    "interval_end_ns",
    "connections_per_second",
    "agent_transactions",
    "agent_duration_ns",
    "agent_failed",
    "transactions",
    "client_connections_per_second",
    "client_duration_ns",
    "connects",
    "connect_min_ns",
    "connect_mean_ns",
    "connect_stddev_ns",
    "connect_p50_ns",
    "connect_p90_ns",
    "connect_p99_ns",
    "connect_p999_ns",
    "connect_p9999_ns",
    "connect_p99999_ns",
    "connect_max_ns",
    "transaction_min_ns",
    "transaction_mean_ns",
    "transaction_stddev_ns",
    "transaction_p50_ns",
    "transaction_p90_ns",
    "transaction_p99_ns",
    "transaction_p999_ns",
    "transaction_p9999_ns",
    "transaction_p99999_ns",
    "transaction_max_ns",
    "errors_refused",
    "errors_timeout",
    "errors_reset",
    "errors_addr_not_available",
    "errors_closed",
    "errors_other",
];

/// The configuration cells (`protocol` to `duration_ns`), which every row repeats.
fn config(r: &CrrResult) -> Vec<(&'static str, String)> {
    vec![
        ("protocol", protocol(r.protocol).to_owned()),
        ("workers", r.workers.to_string()),
        ("request_bytes", r.request_bytes.to_string()),
        ("response_bytes", r.response_bytes.to_string()),
        (
            "close",
            match r.close {
                CrrClose::Fin => "fin",
                CrrClose::Rst => "rst",
            }
            .to_owned(),
        ),
        ("duration_ns", r.duration_ns.to_string()),
    ]
}

/// The summary row's crr cells (every column of [`COLUMNS`] but the interval's; times are
/// empty when there were none, as in the JSON's `null`).
pub(super) fn cells(r: &CrrResult) -> Vec<(&'static str, String)> {
    let mut cells = config(r);
    cells.extend([
        ("connections_per_second", opt_f64(r.connections_per_second)),
        ("agent_transactions", opt(r.agent_transactions)),
        ("agent_duration_ns", opt(r.agent_duration_ns)),
        ("agent_failed", opt(r.agent_failed)),
        ("transactions", r.transactions.to_string()),
        (
            "client_connections_per_second",
            opt_f64(r.client_connections_per_second),
        ),
        ("client_duration_ns", r.client_duration_ns.to_string()),
        ("connects", r.connects.to_string()),
    ]);
    times(&mut cells, r.connect_ns.as_ref(), CONNECT);
    times(&mut cells, r.transaction_ns.as_ref(), TRANSACTION);
    cells.extend(errors(&r.errors));
    cells
}

/// One `interval` row per interval, from `base` (the common head of the run's rows): the interval's span in
/// `interval_start_ns` and `interval_end_ns`, and its figures in the summary's columns:
/// `transactions`, `client_connections_per_second` (the client's rate over the interval),
/// `connects`, `connect_p50_ns`, `connect_p99_ns` (empty with too few connects) and the
/// `errors_*`.
pub(super) fn interval_rows(base: &Row, r: &CrrResult) -> Vec<Row> {
    r.intervals
        .iter()
        .map(|iv| {
            let mut row = base.clone();
            row.extend(config(r));
            row.extend([
                ("row", "interval".to_owned()),
                ("interval_start_ns", iv.start_ns.to_string()),
                ("interval_end_ns", iv.end_ns.to_string()),
                ("transactions", iv.transactions.to_string()),
                (
                    "client_connections_per_second",
                    num_f64(iv.transactions_per_second),
                ),
                ("connects", iv.connects.to_string()),
                ("connect_p50_ns", opt(iv.connect_p50_ns)),
                ("connect_p99_ns", opt(iv.connect_p99_ns)),
            ]);
            row.extend(errors(&iv.errors));
            row
        })
        .collect()
}

fn errors(e: &CrrErrors) -> [(&'static str, String); 6] {
    [
        ("errors_refused", e.refused.to_string()),
        ("errors_timeout", e.timeout.to_string()),
        ("errors_reset", e.reset.to_string()),
        (
            "errors_addr_not_available",
            e.addr_not_available.to_string(),
        ),
        ("errors_closed", e.closed.to_string()),
        ("errors_other", e.other.to_string()),
    ]
}

const CONNECT: [&str; 10] = [
    "connect_min_ns",
    "connect_mean_ns",
    "connect_stddev_ns",
    "connect_p50_ns",
    "connect_p90_ns",
    "connect_p99_ns",
    "connect_p999_ns",
    "connect_p9999_ns",
    "connect_p99999_ns",
    "connect_max_ns",
];

const TRANSACTION: [&str; 10] = [
    "transaction_min_ns",
    "transaction_mean_ns",
    "transaction_stddev_ns",
    "transaction_p50_ns",
    "transaction_p90_ns",
    "transaction_p99_ns",
    "transaction_p999_ns",
    "transaction_p9999_ns",
    "transaction_p99999_ns",
    "transaction_max_ns",
];

fn times(cells: &mut Vec<(&'static str, String)>, t: Option<&RttNs>, names: [&'static str; 10]) {
    let Some(t) = t else {
        return;
    };
    let values = [
        t.min.to_string(),
        num_f64(t.mean),
        num_f64(t.stddev),
        opt(t.p50),
        opt(t.p90),
        opt(t.p99),
        opt(t.p999),
        opt(t.p9999),
        opt(t.p99999),
        t.max.to_string(),
    ];
    cells.extend(names.into_iter().zip(values));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cell_is_a_column_and_the_time_columns_line_up() {
        let names: Vec<&str> = CONNECT.iter().chain(&TRANSACTION).copied().collect();
        assert_eq!(names, COLUMNS[16..36]);
        let crate::TestResult::Crr(r) = crate::fixtures::crr_4_workers() else {
            unreachable!("a crr fixture")
        };
        let cells = cells(&r);
        let keys: Vec<&str> = cells.iter().map(|c| c.0).collect();
        let summary: Vec<&str> = COLUMNS
            .iter()
            .copied()
            .filter(|c| !c.starts_with("interval_"))
            .collect();
        assert_eq!(keys, summary, "one cell per column, in order");
    }

    #[test]
    fn interval_rows_follow_the_summary_in_its_columns() {
        let crate::TestResult::Crr(r) = crate::fixtures::crr_ports_exhausted() else {
            unreachable!("a crr fixture")
        };
        let mut base = Row::new();
        base.insert("row", "summary".to_owned());
        let rows = interval_rows(&base, &r);
        assert_eq!(rows.len(), r.intervals.len());
        let last = rows.last().expect("intervals");
        assert_eq!(last["row"], "interval");
        assert_eq!(last["workers"], "8");
        assert_eq!(last["interval_start_ns"], "2000000000");
        assert_eq!(last["errors_addr_not_available"], "3");
        let sum: u64 = rows
            .iter()
            .map(|r| r["transactions"].parse::<u64>().unwrap())
            .sum();
        assert_eq!(sum, r.transactions);
        for row in &rows {
            for key in row.keys() {
                assert!(
                    COLUMNS.contains(key) || ["row"].contains(key),
                    "{key} is not a crr column"
                );
            }
        }
    }
}
