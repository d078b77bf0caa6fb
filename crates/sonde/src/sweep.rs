//! `--sweep PARAM=VALUES` for latency, throughput and pps: the same test once per value, one
//! document with a row per step.
//!
//! Ctrl-C or SIGTERM ends a sweep early: the step under way stops as its planned end would
//! (marked `interrupted`), the steps measured so far and that one are printed and saved, and
//! the caller's [`crate::interrupt::Interrupt::check`] ends the command with 130 or 143.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sonde_engine::sweep::{Sweep, SweepParam};
use sonde_report::{SweepResult, SweepStep, TestResult};

use crate::output::Progress;
use crate::save::{Measured, Saver};

/// Shared `--help` text of the `--sweep` option.
pub(crate) const SWEEP_HELP: &str =
    "Run the test once per value of one parameter and print one table (one JSON document) \
with a row per step: `msg_size=1:64K:*2` (doubling; the end is always run), \
`msg_size=64:1472:+256` (adding), `msg_size=64,512,1400` (a list). Sizes take binary suffixes \
(64K = 65,536), counts and rates decimal ones (10K = 10,000)";

/// clap's parser for `--sweep`.
pub(crate) fn parse(spec: &str) -> Result<Sweep, String> {
    spec.parse::<Sweep>().map_err(|e| e.to_string())
}

/// Runs `one(value, interrupt)` for each value of `sweep`, which must vary one of `allowed`, and
/// saves each step as a run of one group; `step_time` sizes each step's progress bar. A signal
/// (the `interrupt` flag `one` passes to the test) ends the sweep after the step under way: the
/// document holds the steps measured until then. The caller prints it, then calls
/// [`crate::interrupt::Interrupt::check`].
pub(crate) fn run(
    saver: &mut Saver,
    test: &str,
    label: &str,
    sweep: &Sweep,
    allowed: &[SweepParam],
    step_time: Duration,
    mut one: impl FnMut(u64, &AtomicBool) -> Result<Measured, sonde_client::ClientError>,
) -> anyhow::Result<TestResult> {
    let param = sweep.param();
    if !allowed.contains(&param) {
        let names: Vec<&str> = allowed.iter().map(|p| p.name()).collect();
        return Err(crate::units::BadValue(format!(
            "sonde {test} cannot sweep {param}: it sweeps {}",
            names.join(", ")
        ))
        .into());
    }
    let interrupt = crate::interrupt::install();
    interrupt.check()?;
    let stopped = || interrupt.flag().load(Ordering::Relaxed);
    let started = sonde_client::now_unix_ms();
    let total = sweep.values().len();
    let mut steps = Vec::with_capacity(total);
    for (i, &value) in sweep.values().iter().enumerate() {
        if stopped() {
            break;
        }
        let progress = Progress::start(
            &format!("{label} [{}/{total}] {param}={value}", i + 1),
            step_time,
        );
        let result = one(value, interrupt.flag());
        drop(progress);
        // Each step is saved as its own run as soon as it is measured, all in one group.
        let mut m = match result {
            Ok(m) => m,
            // A test that ends in an error when stopped (an iperf3 server's) leaves the steps
            // measured before it.
            Err(_) if stopped() && !steps.is_empty() => break,
            Err(e) => return Err(e.into()),
        };
        saver.label(&mut m.result, Some((param.name(), value.to_string())));
        saver.grouped("sweep");
        saver.save(&m);
        steps.push(SweepStep {
            value,
            result: m.result,
        });
    }
    Ok(TestResult::Sweep(SweepResult {
        sonde_version: env!("CARGO_PKG_VERSION").into(),
        timestamp_unix_ms: started,
        labels: saver.labels().clone(),
        sweep_test: test.to_owned(),
        parameter: param.name().to_owned(),
        unit: param.unit().to_owned(),
        steps,
    }))
}

/// A swept value as a `u32` option (sizes, counts), or a usage error naming it.
pub(crate) fn as_u32(param: SweepParam, value: u64) -> Result<u32, sonde_client::ClientError> {
    u32::try_from(value)
        .map_err(|_| sonde_client::ClientError::Usage(format!("{param}={value} is out of range")))
}
