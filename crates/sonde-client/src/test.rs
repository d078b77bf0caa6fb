//! One way to run a test: each kind's options implement [`Test`] for each kind of target they
//! can run against, and [`run`] runs any of them, with a [`Controls`] value for what a caller
//! may add to a plain run (an interrupt flag, a callback for live intervals).
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use sonde_client::{resolve, run, Controls, ThroughputOptions};
//! let target = resolve("127.0.0.1", 5300).unwrap();
//! // A plain run.
//! let result = run(&target, &ThroughputOptions::default(), Controls::new()).unwrap();
//! // Ending early on a flag, printing each receiver interval as it arrives.
//! let stop = AtomicBool::new(false);
//! let mut print = |iv: &sonde_report::IntervalResult| println!("{} bit/s", iv.bits_per_second);
//! let controls = Controls::new().interrupt(&stop).on_interval(&mut print);
//! let result = run(&target, &ThroughputOptions::default(), controls).unwrap();
//! ```
//!
//! The targets: a sonde agent ([`Target`]), a real iperf3 or sockperf server
//! ([`Iperf3Server`], [`SockperfServer`]) and helper agents that run the test against a target
//! themselves ([`FromHelpers`], `--from`). A new test kind is one module with its options and their
//! `impl Test`.

use std::convert::Infallible;
use std::sync::atomic::AtomicBool;

use crate::{ClientError, Target};

/// A test the client can run against a target of type `On`: its options. Sealed: the kinds are
/// this crate's.
pub trait Test<On = Target>: sealed::Sealed<On> {
    /// What a run returns.
    type Output;
    /// What a live-interval callback ([`Controls::on_interval`]) sees; [`Infallible`] for a
    /// test that reports none as it runs.
    type Interval;

    /// Runs the test: what [`run`] calls.
    #[doc(hidden)]
    fn run(
        &self,
        on: &On,
        controls: Controls<'_, Self::Interval>,
    ) -> Result<Self::Output, ClientError>;
}

/// Runs `test` against `target`.
///
/// # Errors
/// The options make no sense ([`ClientError::Usage`]), the target cannot be reached or refused
/// the test, or the test broke: see [`ClientError`]. A raised interrupt flag ends a test early
/// with a result marked `interrupted` (an iperf3 test with [`ClientError::Interrupted`]).
pub fn run<On, T: Test<On>>(
    target: &On,
    test: &T,
    controls: Controls<'_, T::Interval>,
) -> Result<T::Output, ClientError> {
    test.run(target, controls)
}

/// Never raised: a plain run's interrupt flag.
static NEVER: AtomicBool = AtomicBool::new(false);

/// What a caller adds to a plain run of a test ([`Controls::new`]: none of it).
#[must_use]
pub struct Controls<'a, I = Infallible> {
    interrupt: &'a AtomicBool,
    on_interval: Option<&'a mut dyn FnMut(&I)>,
    hold: Option<&'a mut dyn FnMut() -> Result<(), ClientError>>,
}

impl<I> Default for Controls<'_, I> {
    fn default() -> Self {
        Self {
            interrupt: &NEVER,
            on_interval: None,
            hold: None,
        }
    }
}

impl<I> std::fmt::Debug for Controls<'_, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controls")
            .field("interrupt", &self.interrupt)
            .field("on_interval", &self.on_interval.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a, I> Controls<'a, I> {
    /// A plain run: never interrupted, no live intervals.
    pub fn new() -> Self {
        Self::default()
    }

    /// When `flag` is raised during the test (Ctrl-C), the test ends early as its planned end
    /// would, and the result covers what was measured until then, marked `interrupted` (the
    /// agent is told to finish first).
    pub fn interrupt(self, flag: &'a AtomicBool) -> Self {
        Self {
            interrupt: flag,
            ..self
        }
    }

    /// `f` sees each interval (`-i`) as it arrives.
    pub fn on_interval(self, f: &'a mut dyn FnMut(&I)) -> Self {
        Self {
            on_interval: Some(f),
            ..self
        }
    }

    /// `hold` is called once the agent is ready (channels open) and before the first byte of
    /// data: a helper waits there for the common start.
    pub(crate) fn hold(self, hold: &'a mut dyn FnMut() -> Result<(), ClientError>) -> Self {
        Self {
            hold: Some(hold),
            ..self
        }
    }

    /// The parts, each borrowed on its own by the run.
    pub(crate) fn parts(self) -> (&'a AtomicBool, OnInterval<'a, I>, Hold<'a>) {
        (
            self.interrupt,
            OnInterval(self.on_interval),
            Hold(self.hold),
        )
    }
}

/// The live-interval callback of [`Controls`], if any.
pub(crate) struct OnInterval<'a, I>(Option<&'a mut dyn FnMut(&I)>);

impl<I> OnInterval<'_, I> {
    pub(crate) fn call(&mut self, iv: &I) {
        if let Some(f) = self.0.as_mut() {
            f(iv);
        }
    }
}

/// The hold hook of [`Controls`], if any.
pub(crate) struct Hold<'a>(Option<&'a mut dyn FnMut() -> Result<(), ClientError>>);

impl Hold<'_> {
    pub(crate) fn call(&mut self) -> Result<(), ClientError> {
        self.0.as_mut().map_or(Ok(()), |h| h())
    }
}

/// A real `iperf3 -s` (`iperf3://HOST[:PORT]`, [`crate::iperf3::target`]).
#[derive(Debug, Clone)]
pub struct Iperf3Server(pub Target);

/// A real `sockperf server` (`sockperf://HOST[:PORT]`, [`crate::sockperf::parse_target`]).
#[derive(Debug, Clone)]
pub struct SockperfServer(pub Target);

/// `--from`: helper agents (started with `--helper` and a shared secret) that each run the test
/// against `target` themselves, all at once; the result is what the target counted from all of
/// them together, and each helper's share. Interrupt flags and live intervals are not passed
/// to helpers.
#[derive(Debug, Clone)]
pub struct FromHelpers {
    /// The target, as the helpers are to reach it (`HOST[:PORT]`).
    pub target: String,
    /// The helpers, resolved.
    pub helpers: Vec<Target>,
}

/// Implements [`Test`] on targets of type `$on` for `$options` whose run takes the interrupt
/// flag alone (no live intervals, no hold): `$run(target, options, interrupt)`. The doc
/// comments go on the impl. The interval type is `Infallible` unless given (`interval: T`, for
/// options whose other targets have intervals: this target gives none).
macro_rules! impl_test {
    ($(#[$doc:meta])* $options:ty, $on:ty => $output:ty, $run:expr $(,)?) => {
        $crate::test::impl_test!($(#[$doc])* $options, $on => $output, interval: std::convert::Infallible, $run);
    };
    ($(#[$doc:meta])* $options:ty, $on:ty => $output:ty, interval: $iv:ty, $run:expr $(,)?) => {
        impl $crate::test::sealed::Sealed<$on> for $options {}

        $(#[$doc])*
        impl $crate::Test<$on> for $options {
            type Output = $output;
            type Interval = $iv;

            fn run(
                &self,
                on: &$on,
                controls: $crate::Controls<'_, $iv>,
            ) -> Result<$output, $crate::ClientError> {
                let run: fn(
                    &$on,
                    &$options,
                    &std::sync::atomic::AtomicBool,
                ) -> Result<$output, $crate::ClientError> = $run;
                run(on, self, controls.parts().0)
            }
        }
    };
}
pub(crate) use impl_test;

pub(crate) mod sealed {
    /// Only this crate's options implement [`super::Test`].
    pub trait Sealed<On> {}
}
