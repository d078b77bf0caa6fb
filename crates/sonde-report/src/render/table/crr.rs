//! The `sonde crr` table: the intervals (`-i`) first, as throughput's are, then the rate
//! counted at the agent, the client's next to it, the connect and transaction times, then the
//! failures by kind.

use super::super::units::{
    fmt_count, fmt_count_f64, fmt_ns, fmt_secs, fmt_size, ns_number, ns_to_s, to_f64, TimeUnit,
};
use super::{context, footer, header, line, plural, Col, Grid, PERCENTILES};
use crate::model::{CrrClose, CrrErrors, CrrResult, RttNs};

pub(crate) fn crr(r: &CrrResult, out: &mut String) {
    header(out, "crr", &r.meta);
    line(
        out,
        format!(
            "TCP connect, request, response, close: {} worker{}, {} request, {} response, {}, {} requested",
            r.workers,
            plural(u64::from(r.workers)),
            fmt_size(u64::from(r.request_bytes)),
            fmt_size(u64::from(r.response_bytes)),
            close_name(r.close),
            fmt_secs(r.duration_ns)
        ),
    );
    out.push('\n');
    if !r.intervals.is_empty() {
        intervals(r, out);
        out.push('\n');
    }
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left()]);
    let agent_rate = match (r.connections_per_second, r.agent_duration_ns) {
        (Some(rate), Some(ns)) => (
            fmt_count_f64(rate),
            format!(
                "counted by the agent over {}: the figure to quote",
                fmt_secs(ns)
            ),
        ),
        _ if r.agent_transactions.is_none() => ("n/a".into(), "the agent reported no count".into()),
        _ => ("n/a".into(), "the agent completed no transaction".into()),
    };
    g.row(["connections/s".into(), agent_rate.0, agent_rate.1]);
    let client_rate = match r.client_connections_per_second {
        Some(rate) => (
            fmt_count_f64(rate),
            format!(
                "counted by the client over {}",
                fmt_secs(r.client_duration_ns)
            ),
        ),
        None => ("n/a".into(), "the client completed no transaction".into()),
    };
    g.row([String::new(), client_rate.0, client_rate.1]);
    g.row([
        "transactions".into(),
        r.agent_transactions
            .map_or_else(|| "n/a".to_owned(), fmt_count),
        "completed at the agent (request in, response out, then the client's close)".into(),
    ]);
    g.row([
        String::new(),
        fmt_count(r.transactions),
        "completed at the client (response read in full)".into(),
    ]);
    g.row([
        "connections".into(),
        fmt_count(r.connects),
        "established by the client".into(),
    ]);
    g.render(out);
    if !r.agents.is_empty() {
        out.push('\n');
        agents(r, out);
    }

    out.push('\n');
    times(r, out);

    out.push('\n');
    failures(r, out);
    context::blocks(out, &r.meta);
    footer(out, &[("", &r.meta)]);
}

fn close_name(c: CrrClose) -> &'static str {
    match c {
        CrrClose::Fin => "the client closes with a FIN",
        CrrClose::Rst => "the client closes with a reset (--rst)",
    }
}

/// A line per interval: its span, transactions, their rate, failures, and the connect times.
fn intervals(r: &CrrResult, out: &mut String) {
    line(out, "Intervals, counted at the client");
    // One time unit for the block, from the run's typical connect time.
    let unit = TimeUnit::for_typical(
        r.connect_ns
            .as_ref()
            .map_or(0.0, |c| c.p50.map_or(c.mean, to_f64)),
    );
    let mut g = Grid::new(vec![
        Col::right(),
        Col::left().gap(1),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
        Col::right(),
    ]);
    g.row([
        "Interval".into(),
        String::new(),
        "transactions".into(),
        "connections/s".into(),
        "failed".into(),
        "connect p50".into(),
        "p99".into(),
    ]);
    let time = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |ns| fmt_ns(to_f64(ns), unit));
    for iv in &r.intervals {
        g.row([
            format!("{:.2}-{:.2}", ns_to_s(iv.start_ns), ns_to_s(iv.end_ns)),
            "sec".into(),
            fmt_count(iv.transactions),
            fmt_count_f64(iv.transactions_per_second),
            fmt_count(errors_total(&iv.errors)),
            time(iv.connect_p50_ns),
            time(iv.connect_p99_ns),
        ]);
    }
    g.render(out);
}

fn errors_total(e: &CrrErrors) -> u64 {
    e.refused + e.timeout + e.reset + e.addr_not_available + e.closed + e.other
}

/// One figure of a time summary, where it has it.
type Stat = fn(&RttNs) -> Option<f64>;

/// Connect and transaction times side by side, in one unit.
fn times(r: &CrrResult, out: &mut String) {
    let (Some(connect), transaction) = (&r.connect_ns, &r.transaction_ns) else {
        line(out, "connect and transaction times: no connection was made");
        return;
    };
    let typical = |t: &RttNs| t.p50.map_or(t.mean, to_f64);
    let unit = TimeUnit::for_typical(transaction.as_ref().map_or(typical(connect), typical));
    let mut g = Grid::new(vec![
        Col::left().indent(2),
        Col::right(),
        Col::right(),
        Col::left(),
    ]);
    let samples = [r.connects, r.transactions];
    g.row([
        format!("time, {}", unit.suffix()),
        "connect".into(),
        "transaction".into(),
        String::new(),
    ]);
    let cell = |t: Option<&RttNs>, v: Stat| {
        t.and_then(v)
            .map_or_else(|| "n/a".to_owned(), |ns| ns_number(ns, unit))
    };
    let both = [Some(connect), transaction.as_ref()];
    let stats: [(&str, Stat); 3] = [
        ("min", |t| Some(to_f64(t.min))),
        ("mean", |t| Some(t.mean)),
        ("stddev", |t| Some(t.stddev)),
    ];
    for (name, v) in stats {
        g.row([
            name.into(),
            cell(both[0], v),
            cell(both[1], v),
            String::new(),
        ]);
    }
    for p in &PERCENTILES {
        let values = both.map(|t| t.and_then(|t| (p.value)(t)));
        let need = p.min_samples();
        // Only a column with times can lack samples; one without any says n/a throughout.
        let too_few = (0..2).any(|i| both[i].is_some() && values[i].is_none() && samples[i] < need);
        let why = if too_few {
            format!("(needs ≥{} samples)", fmt_count(need))
        } else {
            String::new()
        };
        g.row([
            p.label.into(),
            values[0].map_or_else(|| "n/a".to_owned(), |ns| ns_number(to_f64(ns), unit)),
            values[1].map_or_else(|| "n/a".to_owned(), |ns| ns_number(to_f64(ns), unit)),
            why,
        ]);
    }
    g.row([
        "max".into(),
        cell(both[0], |t| Some(to_f64(t.max))),
        cell(both[1], |t| Some(to_f64(t.max))),
        String::new(),
    ]);
    g.render(out);
}

/// The failures by kind, only those that happened.
/// Each agent's share, when a load balancer spread the test over several.
fn agents(r: &CrrResult, out: &mut String) {
    line(
        out,
        format!(
            "spread by a load balancer over {} agents, each counting its own:",
            r.agents.len()
        ),
    );
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::right(), Col::left()]);
    g.row([
        "  agent".into(),
        "connections/s".into(),
        "transactions".into(),
        "CPU".into(),
    ]);
    for a in &r.agents {
        g.row([
            format!("  {}", a.addr),
            a.connections_per_second
                .map_or_else(|| "n/a".to_owned(), fmt_count_f64),
            fmt_count(a.transactions),
            a.cpu
                .as_ref()
                .and_then(|c| c.percent_of_one_core)
                .map_or_else(|| "n/a".to_owned(), |p| format!("{p:.1}% of a core")),
        ]);
    }
    g.render(out);
}

fn failures(r: &CrrResult, out: &mut String) {
    let e = &r.errors;
    let kinds = [
        ("refused", e.refused, "connection refused (ECONNREFUSED)"),
        (
            "timeout",
            e.timeout,
            "the connect or the response took longer than the client's timeout",
        ),
        ("reset", e.reset, "reset before the whole response"),
        (
            "no local port",
            e.addr_not_available,
            "EADDRNOTAVAIL: every ephemeral port in use or in TIME_WAIT",
        ),
        (
            "closed",
            e.closed,
            "closed by the agent before the whole response",
        ),
        ("other", e.other, "other errors"),
        (
            "other agent",
            e.other_agent,
            "placed by a load balancer on an agent without the test's session",
        ),
    ];
    let total: u64 = kinds.iter().map(|k| k.1).sum();
    let agent = r.agent_failed.filter(|&n| n > 0);
    if total == 0 && agent.is_none() {
        line(out, "failed attempts: none");
        return;
    }
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left()]);
    g.row([
        "failed attempts".into(),
        fmt_count(total),
        "seen by the client".into(),
    ]);
    for (name, n, what) in kinds {
        if n > 0 {
            g.row([format!("  {name}"), fmt_count(n), what.into()]);
        }
    }
    if let Some(n) = agent {
        g.row([
            "agent failed".into(),
            fmt_count(n),
            "connections of this test the agent could not complete".into(),
        ]);
    }
    g.render(out);
}

/// The headline of a crr case in `sonde quick` and sweeps.
pub(crate) fn headline(r: &CrrResult) -> (String, String) {
    let rate = r
        .connections_per_second
        .map_or_else(|| "n/a".to_owned(), fmt_count_f64);
    let mut details = format!(
        "TCP, {} worker{}, {}/{} B",
        r.workers,
        plural(u64::from(r.workers)),
        r.request_bytes,
        r.response_bytes
    );
    if let Some(p50) = r.connect_ns.as_ref().and_then(|c| c.p50) {
        details.push_str(&format!(
            ", connect p50 {} µs",
            ns_number(to_f64(p50), TimeUnit::Micros)
        ));
    }
    let failed = errors_total(&r.errors);
    if failed > 0 {
        details.push_str(&format!(", {} failed", fmt_count(failed)));
    }
    (format!("{rate} connections/s"), details)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::model::TestResult;

    fn crr_fixture(f: fn() -> TestResult) -> CrrResult {
        let TestResult::Crr(r) = f() else {
            unreachable!("a crr fixture")
        };
        r
    }

    fn render(r: &CrrResult) -> String {
        let mut out = String::new();
        crr(r, &mut out);
        out
    }

    fn row<'t>(t: &'t str, start: &str) -> &'t str {
        t.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in\n{t}"))
    }

    #[test]
    fn the_agents_rate_comes_first_and_is_the_figure_to_quote() {
        let t = render(&crr_fixture(fixtures::crr_4_workers));
        let first = row(&t, "connections/s");
        assert!(first.contains(" 14,323 "), "{t}");
        assert!(first.ends_with("counted by the agent over 9.998 s: the figure to quote"));
        assert!(
            t.contains(" 14,322  counted by the client over 9.999 s\n"),
            "{t}"
        );
        // The lost SYN's 1 s shows in the connect maximum, in the table's one unit.
        assert!(row(&t, "  max ").contains(" 1031.17 "), "{t}");
        assert!(t.contains("failed attempts: none\n"), "{t}");
    }

    #[test]
    fn figures_that_were_not_measured_read_n_a_with_the_reason() {
        let mut r = crr_fixture(fixtures::crr_4_workers);
        r.agent_transactions = None;
        r.agent_duration_ns = None;
        r.agent_failed = None;
        r.connections_per_second = None;
        let t = render(&r);
        assert!(
            row(&t, "connections/s").ends_with(" n/a  the agent reported no count"),
            "{t}"
        );
        assert!(row(&t, "transactions").contains(" n/a "), "{t}");

        r.agent_transactions = Some(0);
        r.transactions = 0;
        r.client_connections_per_second = None;
        r.transaction_ns = None;
        let t = render(&r);
        assert!(
            row(&t, "connections/s").ends_with("the agent completed no transaction"),
            "{t}"
        );
        assert!(
            t.contains("n/a  the client completed no transaction"),
            "{t}"
        );
        // Connections without a transaction: their connect times, and n/a for the rest.
        assert!(row(&t, "  p50 ").ends_with(" 38.14          n/a"), "{t}");

        r.connects = 0;
        r.connect_ns = None;
        let t = render(&r);
        assert!(
            t.contains("\nconnect and transaction times: no connection was made\n"),
            "{t}"
        );
        assert!(!t.contains(" 0.00 "), "{t}");
    }

    #[test]
    fn failures_list_only_the_kinds_that_happened() {
        let t = render(&crr_fixture(fixtures::crr_ports_exhausted));
        assert!(
            row(&t, "failed attempts").contains("  4  seen by the client"),
            "{t}"
        );
        assert!(
            row(&t, "  no local port").contains(" 3  EADDRNOTAVAIL"),
            "{t}"
        );
        assert!(row(&t, "  timeout").contains(" 1 "), "{t}");
        assert!(!t.contains("  refused"), "{t}");
        assert!(row(&t, "agent failed").contains(" 1 "), "{t}");
        assert!(
            row(&t, "  p99.99 ").ends_with("n/a  (needs ≥100,000 samples)"),
            "{t}"
        );
    }

    #[test]
    fn intervals_come_first_a_line_each_with_n_a_for_what_they_cannot_state() {
        let mut r = crr_fixture(fixtures::crr_ports_exhausted);
        let t = render(&r);
        let head = t.find("Intervals, counted at the client\n").expect(&t);
        assert!(head < t.find("connections/s  ").expect(&t), "{t}");
        let cells = |t: &str, span: &str| -> Vec<String> {
            row(t, span).split_whitespace().map(str::to_owned).collect()
        };
        assert_eq!(
            cells(&t, "0.00-1.00 sec"),
            [
                "0.00-1.00",
                "sec",
                "13,519",
                "13,519",
                "0",
                "84.48",
                "µs",
                "159.74",
                "µs"
            ],
            "{t}"
        );
        // The last, short interval: its own rate, and the EADDRNOTAVAIL that ended the test.
        assert_eq!(
            cells(&t, "2.00-2.09 sec")[2..5],
            ["1,245", "13,337", "3"],
            "{t}"
        );

        // An interval with nothing in it: zeros, and no connect times.
        let quiet = &mut r.intervals[1];
        quiet.transactions = 0;
        quiet.transactions_per_second = 0.0;
        quiet.connects = 0;
        quiet.connect_p50_ns = None;
        quiet.connect_p99_ns = None;
        let t = render(&r);
        assert_eq!(
            cells(&t, "1.00-2.00 sec"),
            ["1.00-2.00", "sec", "0", "0", "1", "n/a", "n/a"],
            "{t}"
        );

        r.intervals.clear();
        assert!(!render(&r).contains("Intervals"));
    }

    #[test]
    fn a_quick_headline_names_the_agents_rate() {
        let (headline, details) = headline(&crr_fixture(fixtures::crr_ports_exhausted));
        assert_eq!(headline, "13,488 connections/s");
        assert_eq!(
            details,
            "TCP, 8 workers, 64/1024 B, connect p50 84.99 µs, 4 failed"
        );
    }
}
