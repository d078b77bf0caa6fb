//! `sonde load`: latency idle and under load. The same probes run twice against one agent:
//! first on the idle path, then while bulk TCP streams load it, so the difference is what the
//! load's queues add to every round trip (bufferbloat).

use std::sync::atomic::AtomicBool;

use sonde_report::WarningCode;
use std::thread;
use std::time::{Duration, Instant};

use sonde_report::{AddedRttNs, LoadResult, Meta};
use sonde_wire::Protocol;

use crate::{ClientError, Controls, LatencyOptions, Target, ThroughputOptions};

/// How long the load keeps running after the loaded probes are due to end, so that a probe run
/// that takes a little longer than planned (handshake, the last replies) is still loaded.
const LOAD_TAIL: Duration = Duration::from_secs(1);

/// `sonde load` options.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The probes, run once idle and once loaded, each for `probes.duration` after
    /// `probes.warmup`. `probes.count` must be `None`: a phase has a fixed length.
    pub probes: LatencyOptions,
    /// The load: TCP streams (`load.duration` is set from the probes and the ramp).
    pub load: ThroughputOptions,
    /// How long the load runs before the loaded probes start.
    pub ramp: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            probes: LatencyOptions {
                rate: Some(1_000.0),
                ..LatencyOptions::default()
            },
            load: ThroughputOptions {
                parallel: 4,
                ..ThroughputOptions::default()
            },
            ramp: Duration::from_secs(2),
        }
    }
}

impl LoadOptions {
    /// How long the load runs: the ramp, the probes' warm-up and measured time, and a tail.
    pub fn load_duration(&self) -> Duration {
        self.ramp + self.probes.warmup + self.probes.duration + LOAD_TAIL
    }

    /// The whole run, roughly: idle probes, then the load.
    pub fn expected(&self) -> Duration {
        self.probes.warmup + self.probes.duration + self.load_duration()
    }
}

/// A load result and the RTT histograms of its two probe runs, for the results store.
#[derive(Debug, Clone)]
pub struct LoadMeasurement {
    /// The document.
    pub result: LoadResult,
    /// The idle probes' RTT histogram (hdrhistogram V2, deflated).
    pub idle_rtt_histogram: Vec<u8>,
    /// The loaded probes' RTT histogram (hdrhistogram V2, deflated).
    pub loaded_rtt_histogram: Vec<u8>,
}

crate::test::impl_test!(
    /// The idle probes, then the load and the loaded probes together, keeping the probes' RTT
    /// histograms. Interrupted (Ctrl-C), the phase running ends early and any phase after it
    /// stops as soon as it starts: each run says `interrupted`.
    LoadOptions, Target => LoadMeasurement, latency_under_load
);

fn latency_under_load(
    target: &Target,
    opt: &LoadOptions,
    interrupt: &AtomicBool,
) -> Result<LoadMeasurement, ClientError> {
    if opt.probes.count.is_some() {
        return Err(ClientError::Usage(
            "a load test's phases run for a time (-t), not a count".into(),
        ));
    }
    if opt.load.protocol != Protocol::Tcp {
        return Err(ClientError::Usage("the load is bulk TCP".into()));
    }
    let started = crate::now_unix_ms();
    let probes = || Controls::new().interrupt(interrupt);
    let crate::LatencyMeasurement {
        result: idle,
        rtt_histogram: idle_rtt_histogram,
    } = crate::run(target, &opt.probes, probes())?;

    let load_opt = ThroughputOptions {
        duration: opt.load_duration(),
        ..opt.load.clone()
    };
    let (load, loaded, probes_late) = thread::scope(|s| {
        let load_started = Instant::now();
        let load = s.spawn(|| crate::run(target, &load_opt, Controls::new().interrupt(interrupt)));
        thread::sleep(opt.ramp);
        let loaded = crate::run(target, &opt.probes, probes());
        // The load's senders stop `load_duration` after they start (the handshake before that
        // makes it a little later still, never earlier).
        let probes_late = load_started.elapsed() > opt.load_duration();
        (load.join(), loaded, probes_late)
    });
    let mut load = load.map_err(|_| ClientError::Protocol("the load thread panicked".into()))??;
    let crate::LatencyMeasurement {
        result: mut loaded,
        rtt_histogram: loaded_rtt_histogram,
    } = loaded?;

    // Each of the two ran during the other by design: that is not someone else's session, when
    // they ran on one agent. Behind a load balancer they may have reached two.
    let agents = (
        loaded.meta.agent.as_ref().map(|a| a.id.clone()),
        load.meta.agent.as_ref().map(|a| a.id.clone()),
    );
    match agents {
        (Some(probes), Some(load_agent)) if probes != load_agent => {
            let w = sonde_report::Warning::LoadOnOtherAgent {
                probes: loaded
                    .meta
                    .agent
                    .as_ref()
                    .map_or_else(String::new, |a| a.addr.clone()),
                load: load
                    .meta
                    .agent
                    .as_ref()
                    .map_or_else(String::new, |a| a.addr.clone()),
            };
            loaded.meta.add(&w);
            load.meta.add(&w);
        }
        _ => {
            discount_own_session(&mut loaded.meta);
            discount_own_session(&mut load.meta);
        }
    }
    if probes_late {
        loaded.meta.add(&sonde_report::Warning::LoadEndedEarly);
    }
    if load.receiver.bytes == 0 {
        loaded.meta.add(&sonde_report::Warning::NoLoad);
    }
    let result = LoadResult {
        sonde_version: env!("CARGO_PKG_VERSION").into(),
        timestamp_unix_ms: started,
        labels: sonde_report::Labels::new(),
        ramp_ns: u64::try_from(opt.ramp.as_nanos()).unwrap_or(u64::MAX),
        added_rtt_ns: AddedRttNs::between(&idle, &loaded),
        idle,
        loaded,
        load,
    };
    Ok(LoadMeasurement {
        result,
        idle_rtt_histogram,
        loaded_rtt_histogram,
    })
}

/// Takes the other half of this load test out of a run's overlap count and its warning.
fn discount_own_session(meta: &mut Meta) {
    if meta.overlapping_sessions == 0 {
        return;
    }
    meta.overlapping_sessions -= 1;
    meta.remove_warnings(WarningCode::OverlappingSessions);
    if meta.overlapping_sessions > 0 {
        let w = sonde_report::Warning::OverlappingSessions {
            sessions: meta.overlapping_sessions,
        };
        meta.warnings.insert(0, w.to_string());
        meta.warning_codes.insert(0, w.code());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_session_is_discounted_and_others_still_warned() {
        let mut meta = Meta {
            sonde_version: "0".into(),
            timestamp_unix_ms: 0,
            server: "x".into(),
            peer: sonde_report::Peer::Sonde,
            session: 1,
            overlapping_sessions: 1,
            warnings: vec![
                sonde_report::Warning::OverlappingSessions { sessions: 1 }.to_string(),
                "other".into(),
            ],
            warning_codes: vec![WarningCode::OverlappingSessions, WarningCode::Loss],
            labels: sonde_report::Labels::new(),
            interrupted: false,
            hosts: sonde_report::Hosts::default(),
            agent: None,
            cpu: sonde_report::CpuCosts::default(),
            sources: Vec::new(),
            interfaces: None,
        };
        discount_own_session(&mut meta);
        assert_eq!(meta.overlapping_sessions, 0);
        assert_eq!(meta.warnings, ["other"]);

        assert_eq!(meta.warning_codes, [WarningCode::Loss]);

        meta.overlapping_sessions = 3;
        meta.warnings.clear();
        meta.warning_codes.clear();
        meta.add(&sonde_report::Warning::OverlappingSessions { sessions: 3 });
        discount_own_session(&mut meta);
        assert_eq!(meta.overlapping_sessions, 2);
        assert_eq!(
            meta.warnings,
            [sonde_report::Warning::OverlappingSessions { sessions: 2 }.to_string()]
        );
        assert_eq!(meta.warning_codes, [WarningCode::OverlappingSessions]);
    }

    #[test]
    fn phases_need_a_time_and_the_load_is_tcp() {
        let target = Target {
            addr: "127.0.0.1:9".parse().unwrap(),
            label: "x".into(),
            secret: None,
            source: crate::Source::default(),
        };
        let mut opt = LoadOptions::default();
        opt.probes.count = Some(10);
        assert!(matches!(
            crate::run(&target, &opt, Controls::new()),
            Err(ClientError::Usage(_))
        ));
        let mut opt = LoadOptions::default();
        opt.load.protocol = Protocol::Udp;
        assert!(matches!(
            crate::run(&target, &opt, Controls::new()),
            Err(ClientError::Usage(_))
        ));
    }
}
