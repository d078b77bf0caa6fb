//! Distributions as the result documents state them, from the engine's RTT summaries.
//!
//! Below `inner` and `results`, which both use it.

use sonde_report::RttNs;

/// A distribution as the documents state it: a percentile the sample count cannot support is
/// `None` (the engine's rule).
pub(crate) fn rtt_ns(s: &sonde_engine::rtt::RttSummary) -> RttNs {
    let at = |p: f64| {
        s.percentiles
            .iter()
            .find(|x| (x.pct - p).abs() < 1e-9)
            .and_then(|x| x.value_ns)
    };
    RttNs {
        min: s.min_ns,
        mean: s.mean_ns,
        stddev: s.stddev_ns,
        p50: at(50.0),
        p90: at(90.0),
        p99: at(99.0),
        p999: at(99.9),
        p9999: at(99.99),
        p99999: at(99.999),
        max: s.max_ns,
    }
}

/// [`rtt_ns`] of a recorder, `None` when it holds no samples.
pub(crate) fn rtt_ns_if_any(r: &sonde_engine::rtt::RttRecorder) -> Option<RttNs> {
    let s = r.summary();
    (s.samples > 0).then(|| rtt_ns(&s))
}

/// `-i`: one interval of the loop's, in the document's form (`rtt_ns` null without replies).
pub(crate) fn latency_interval(
    iv: &sonde_net::latency::RttInterval,
) -> sonde_report::LatencyInterval {
    sonde_report::LatencyInterval {
        start_ns: iv.start_ns,
        end_ns: iv.end_ns,
        samples: iv.rtt.samples,
        rtt_ns: (iv.rtt.samples > 0).then(|| rtt_ns(&iv.rtt)),
        transactions_per_second: None,
    }
}
