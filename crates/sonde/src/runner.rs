//! What every test subcommand does with its options: `--repeat` runs, each measured, printed
//! and saved. The subcommands implement [`Test`]; `spec` names them for plans.

use std::time::Duration;

use crate::output::OutputOpt;
use crate::save::{SaveOpt, Saver};

/// What a test subcommand's options give the runner.
pub(crate) trait Test {
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
