//! What every test subcommand does with its options: `--repeat` runs, each measured, printed
//! and saved. The subcommands implement [`Test`]; `spec` names them for plans.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::output::{OutputOpt, Progress};
use crate::save::{Measured, SaveOpt, Saver};

/// What a test subcommand's options give the runner.
pub(crate) trait Test: std::fmt::Debug {
    /// Where the result is saved, `--repeat` and `--pause`.
    fn save_opt(&self) -> &SaveOpt;
    /// `--json`, `--csv`, `--json-stream`.
    fn output(&self) -> OutputOpt;
    /// How long one run measures (warm-up included), for the progress bar and a plan's
    /// estimate; connection setup comes on top.
    fn expected(&self) -> Duration;
    /// One run (of `--repeat`): measured, printed and saved with `saver`.
    fn run_once(&self, saver: &mut Saver) -> anyhow::Result<()>;
}

/// A test subcommand: `--repeat` runs of the test, one saver (so one group when repeated).
pub(crate) fn run(test: &dyn Test) -> anyhow::Result<()> {
    crate::save::repeat(test.save_opt(), test.output(), |saver| test.run_once(saver))
}

/// One run, measured, printed and saved: Ctrl-C or SIGTERM sets the flag `measure` is given
/// (the test ends early and what it measured is printed and saved; then the error says which
/// signal came, exit 130 or 143), and a progress bar labelled `label` runs for `expected` while
/// it measures (`measure` may print live lines above it).
pub(crate) fn measure(
    saver: &mut Saver,
    output: OutputOpt,
    label: &str,
    expected: Duration,
    measure: impl FnOnce(&AtomicBool, &Progress) -> anyhow::Result<Measured>,
) -> anyhow::Result<()> {
    let interrupt = crate::interrupt::install();
    interrupt.check()?;
    let progress = Progress::start(label, expected);
    let result = measure(interrupt.flag(), &progress);
    drop(progress);
    let mut m = result?;
    saver.print_and_save(output, &mut m)?;
    interrupt.check()
}

/// One run of the client's `test` against `target` (an agent, a foreign server or helpers),
/// as the store keeps it: what every subcommand, `quick`, the sweeps and the mesh run a test
/// with.
pub(crate) fn client_run<On, T>(
    target: &On,
    test: &T,
    controls: sonde_client::Controls<'_, T::Interval>,
) -> Result<Measured, sonde_client::ClientError>
where
    T: sonde_client::Test<On>,
    Measured: From<T::Output>,
{
    sonde_client::run(target, test, controls).map(Measured::from)
}

/// Implements [`Test`] for the subcommand's `Opt` in scope, whose `output: OutputOpt` and
/// `save: SaveOpt` are flattened in: `expected` says how long one run of those options measures,
/// `run_once` runs one.
macro_rules! impl_test {
    (expected: $expected:expr, run_once: $run_once:path $(,)?) => {
        impl $crate::runner::Test for Opt {
            fn save_opt(&self) -> &$crate::save::SaveOpt {
                &self.save
            }
            fn output(&self) -> $crate::output::OutputOpt {
                self.output
            }
            fn expected(&self) -> std::time::Duration {
                let expected: fn(&Opt) -> std::time::Duration = $expected;
                expected(self)
            }
            fn run_once(&self, saver: &mut $crate::save::Saver) -> anyhow::Result<()> {
                $run_once(self, saver)
            }
        }
    };
}
pub(crate) use impl_test;
