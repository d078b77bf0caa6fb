//! The `sonde crr` columns: one summary row per run.

use super::{num_f64, opt, opt_f64, protocol};
use crate::model::{CrrClose, CrrResult, RttNs};

/// The columns of a crr run, after the common head.
pub(super) const COLUMNS: [&str; 40] = [
    "protocol",
    "workers",
    "request_bytes",
    "response_bytes",
    "close",
    "duration_ns",
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

/// The summary row's crr cells (every column of [`COLUMNS`]; times are empty when there were
/// none, as in the JSON's `null`).
pub(super) fn cells(r: &CrrResult) -> Vec<(&'static str, String)> {
    let mut cells = vec![
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
    ];
    let e = &r.errors;
    times(&mut cells, r.connect_ns.as_ref(), CONNECT);
    times(&mut cells, r.transaction_ns.as_ref(), TRANSACTION);
    cells.extend([
        ("errors_refused", e.refused.to_string()),
        ("errors_timeout", e.timeout.to_string()),
        ("errors_reset", e.reset.to_string()),
        (
            "errors_addr_not_available",
            e.addr_not_available.to_string(),
        ),
        ("errors_closed", e.closed.to_string()),
        ("errors_other", e.other.to_string()),
    ]);
    cells
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
        assert_eq!(names, COLUMNS[14..34]);
        let crate::TestResult::Crr(r) = crate::fixtures::crr_4_workers() else {
            unreachable!("a crr fixture")
        };
        let cells = cells(&r);
        let keys: Vec<&str> = cells.iter().map(|c| c.0).collect();
        assert_eq!(keys, COLUMNS, "one cell per column, in order");
    }
}
