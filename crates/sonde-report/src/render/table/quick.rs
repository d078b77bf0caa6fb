//! `sonde quick`'s table: one line per case.

use super::{footer, line, plural, Col, Grid};
use crate::model::{Meta, QuickResult};
use crate::render::units::fmt_timestamp;

pub(crate) fn quick(r: &QuickResult, out: &mut String) {
    let mut servers: Vec<&str> = Vec::new();
    for c in &r.results {
        if let Some(m) = c.result.meta() {
            if !servers.contains(&m.server.as_str()) {
                servers.push(&m.server);
            }
        }
    }
    let server = if servers.is_empty() {
        String::new()
    } else {
        format!(", server {}", servers.join(", "))
    };
    line(
        out,
        format!(
            "sonde {} quick: {} case{}{server}, started {}",
            r.sonde_version,
            r.results.len(),
            plural(r.results.len() as u64),
            fmt_timestamp(r.timestamp_unix_ms)
        ),
    );
    line(
        out,
        "headline: RTT (latency), receiver bitrate (throughput), received datagrams/s (pps), \
         connections/s counted by the agent (crr)",
    );
    out.push('\n');
    let mut g = Grid::new(vec![Col::left(), Col::right(), Col::left(), Col::left()]);
    g.row([
        "case".into(),
        "session".into(),
        "headline".into(),
        "details".into(),
    ]);
    for c in &r.results {
        let session = c
            .result
            .meta()
            .map_or_else(String::new, |m| m.session.to_string());
        let (headline, details) = c.result.kind().headline();
        g.row([c.case.clone(), session, headline, details]);
    }
    g.render(out);
    let metas: Vec<(&str, &Meta)> = r
        .results
        .iter()
        .filter_map(|c| c.result.meta().map(|m| (c.case.as_str(), m)))
        .collect();
    footer(out, &metas);
}

/// A nested quick's figure to quote in quick's table.
pub(crate) fn headline(q: &QuickResult) -> (String, String) {
    (format!("{} nested cases", q.results.len()), String::new())
}
