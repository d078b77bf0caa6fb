//! `sonde crr`'s document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::context::CpuCost;
use super::meta::{Meta, Protocol};
use super::stats::RttNs;

/// How the client closed each connection of a crr test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CrrClose {
    /// A FIN, as in netperf's `TCP_CRR`: the client's end then waits in `TIME_WAIT` (60 s on
    /// Linux), holding its ephemeral port.
    Fin,
    /// A reset (`SO_LINGER` 0, `--rst`): no closing handshake and no `TIME_WAIT`.
    Rst,
}

/// Failed attempts of a crr test by kind, counted by the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CrrErrors {
    /// Connections refused (`ECONNREFUSED`).
    pub refused: u64,
    /// A connect, or the wait for the whole response, that passed the client's timeout.
    pub timeout: u64,
    /// Connections reset before the response was read in full.
    pub reset: u64,
    /// Connects that found no free local port (`EADDRNOTAVAIL`): the client's ephemeral ports
    /// were all in use or in `TIME_WAIT`. The first one ends the test.
    pub addr_not_available: u64,
    /// Connections the agent closed before the whole response (it refused them).
    pub closed: u64,
    /// Anything else (out of file descriptors, no route...).
    pub other: u64,
    /// Connections a load balancer placed on an agent that had no session of the test (one
    /// the client had not found behind the address): not transactions, not faults. Absent
    /// from older documents.
    #[serde(default)]
    pub other_agent: u64,
}

/// `sonde crr`: connection rate. Each transaction is a new TCP connection: connect, a request,
/// the agent's response, close; `workers` connections at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CrrResult {
    /// Common facts.
    #[serde(flatten)]
    pub meta: Meta,
    /// Always `tcp`.
    pub protocol: Protocol,
    /// Connections at a time: each worker makes one transaction after another.
    pub workers: u32,
    /// Request size, bytes.
    pub request_bytes: u32,
    /// Response size, bytes.
    pub response_bytes: u32,
    /// How the client closed each connection.
    pub close: CrrClose,
    /// Requested duration, ns.
    pub duration_ns: u64,
    /// Transactions per second counted by the agent over its own window (the figure to quote);
    /// `null` when the agent completed none or did not report.
    pub connections_per_second: Option<f64>,
    /// Transactions the agent completed: request read, response written, then the client's
    /// close. `null` when the agent did not report.
    pub agent_transactions: Option<u64>,
    /// The agent's window: its first identified connection to its last completed transaction,
    /// ns; `null` when it completed none or did not report.
    pub agent_duration_ns: Option<u64>,
    /// Connections of this test the agent could not complete; `null` when it did not report.
    pub agent_failed: Option<u64>,
    /// Transactions the client completed: response read in full.
    pub transactions: u64,
    /// Transactions per second counted by the client over its own window; `null` when it
    /// completed none.
    pub client_connections_per_second: Option<f64>,
    /// The client's window: its first connect to its last completed transaction, ns (0 when it
    /// completed none).
    pub client_duration_ns: u64,
    /// Connections the client established (those that then failed included).
    pub connects: u64,
    /// Connect times, from the `connect` call to the connection established: one round trip,
    /// plus the retransmission timeout (1 s at first on Linux) when a SYN or SYN-ACK was lost.
    /// The percentiles follow the latency rule (`samples >= 10 / (1 - p)`); `null` without
    /// any connection.
    pub connect_ns: Option<RttNs>,
    /// Transaction times, from the `connect` call to the last byte of the response; `null`
    /// without any completed transaction.
    pub transaction_ns: Option<RttNs>,
    /// Failed attempts by kind, counted by the client.
    pub errors: CrrErrors,
    /// Intervals (`-i`), counted by the client; empty without `-i`. Together they hold every
    /// transaction, connect and failure of the client's totals.
    #[serde(default)]
    pub intervals: Vec<CrrInterval>,
    /// Through a load balancer with several agents behind the address: each agent's share, as
    /// it counted it (the `agent_*` figures above are their sum, the rate the sum of their
    /// rates). Absent on a direct path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<CrrAgentShare>,
    /// `-w`, `-C`, `-M`, `-S`/`--dscp`/`--ecn`: set on every connection at both ends, as asked
    /// and as each end's kernel granted them on its first connection (the first agent's,
    /// behind a balancer). Absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<super::context::EndsSocket>,
}

/// One agent's part of a crr test a load balancer spread over several agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CrrAgentShare {
    /// The agent process (16 hex digits).
    pub id: String,
    /// The address the agent saw the test arrive at (its own).
    pub addr: String,
    /// Exchanges it completed.
    pub transactions: u64,
    /// Its transactions over its own window, per second; `null` without any.
    pub connections_per_second: Option<f64>,
    /// Connections of the test it could not complete.
    pub failed: u64,
    /// Its CPU cost of the test; `null` when it did not report one.
    pub cpu: Option<CpuCost>,
}

/// One interval of a crr test, counted by the client. Each event counts in the interval it
/// happened in: a transaction when its response was read in full, a connect when the
/// connection was established, a failure when the client saw it. Intervals follow each other
/// on a grid from the start of the client's workers; the last ends when the last worker ended
/// (shorter than the others, or longer when attempts still ran after the test's time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CrrInterval {
    /// Start, ns since the client's workers started.
    pub start_ns: u64,
    /// End, ns since the client's workers started: the next interval's start.
    pub end_ns: u64,
    /// Transactions completed (response read in full) in the interval.
    pub transactions: u64,
    /// `transactions` over the interval's length, per second: 0 when none completed in it.
    pub transactions_per_second: f64,
    /// Connections established in the interval.
    pub connects: u64,
    /// Failed attempts seen in the interval, by kind.
    pub errors: CrrErrors,
    /// Median connect time of the interval's connects, ns (to 2 significant digits); `null`
    /// with fewer than 20 of them.
    pub connect_p50_ns: Option<u64>,
    /// 99th percentile connect time, ns; `null` with fewer than 1,000 connects in the interval.
    pub connect_p99_ns: Option<u64>,
}

#[cfg(test)]
mod crr_tests {
    use crate::model::TestResult;

    #[test]
    fn a_crr_document_from_before_intervals_reads_with_none() {
        let mut doc = serde_json::to_value(crate::fixtures::crr_ports_exhausted()).unwrap();
        assert_eq!(doc["intervals"].as_array().map(Vec::len), Some(3));
        assert!(doc["intervals"][0]["connect_p99_ns"].is_u64());
        doc.as_object_mut().unwrap().remove("intervals");
        let TestResult::Crr(r) = serde_json::from_value(doc).unwrap() else {
            unreachable!("a crr document")
        };
        assert!(r.intervals.is_empty());
    }
}
