//! Where results go: a table for people, JSON or CSV for programs, a progress bar on a terminal.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use sonde_report::export::{exporter, stream_line, Exporter, Format};
use sonde_report::TestResult;

/// Output options shared by the test subcommands.
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct OutputOpt {
    /// One JSON document on stdout (schema: schema/sonde-result.schema.json)
    #[arg(short = 'J', long, conflicts_with = "csv")]
    pub(crate) json: bool,
    /// CSV on stdout: a header line, then a summary row and detail rows (the `row` column says
    /// which)
    #[arg(long)]
    pub(crate) csv: bool,
    /// One JSON object per line as the test runs, as iperf3 3.17's --json-stream:
    /// `{"event":"interval","data":{...}}` for each -i interval as it is counted (the
    /// receiver's counts; TCP_INFO joins them in the document), then
    /// `{"event":"end","data":DOCUMENT}` (the --json document)
    #[arg(long, conflicts_with_all = ["json", "csv"])]
    pub(crate) json_stream: bool,
}

impl OutputOpt {
    /// The format the flags chose: the one place that reads them.
    pub(crate) fn format(self) -> Format {
        if self.json_stream {
            Format::JsonStream
        } else if self.json {
            Format::Json
        } else if self.csv {
            Format::Csv
        } else {
            Format::Table
        }
    }

    /// The exporter of the chosen [`format`](Self::format).
    pub(crate) fn exporter(self) -> &'static dyn Exporter {
        exporter(self.format())
    }

    /// Renders the result in the chosen format.
    pub(crate) fn render(self, result: &TestResult) -> String {
        self.exporter().document(result)
    }

    /// Where a live interval goes as it is counted: a `--json-stream` line; above the progress
    /// bar on a terminal; else, for table output, a line on stdout at once (a pipe or a file
    /// sees the test progress too, as a terminal does); nothing for --json and --csv, whose
    /// document holds the intervals.
    pub(crate) fn live_interval(
        self,
        progress: &Progress,
        line: &str,
        interval: &impl serde::Serialize,
    ) {
        // A closed stdout is not an error here either: the final print will say nothing.
        if self.json_stream {
            let _ = print(&stream_line("interval", interval));
        } else if progress.is_shown() {
            progress.println(line);
        } else if self.exporter().is_for_people() {
            let _ = print(&format!("{line}\n"));
        }
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
pub(crate) fn print(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// What goes before every progress bar's label: a plan's "[case k of n, time left]".
static PREFIX: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Sets the text before the labels of the progress bars started from now on (`sonde plan run`:
/// which run of the plan, and the time left).
pub(crate) fn set_progress_prefix(prefix: &str) {
    let mut p = PREFIX
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    prefix.clone_into(&mut p);
}

/// A progress bar on stderr while a test runs, only when stderr is a terminal.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    done: Arc<AtomicBool>,
    ticker: Option<thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts a bar for a test of `total` labelled `label`.
    pub(crate) fn start(label: &str, total: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !io::stderr().is_terminal() {
            return Self {
                bar: None,
                done,
                ticker: None,
            };
        }
        let total_ms = u64::try_from(total.as_millis()).unwrap_or(u64::MAX).max(1);
        let bar = indicatif::ProgressBar::new(total_ms);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let prefix = PREFIX
            .lock()
            .map_or_else(|e| e.into_inner().clone(), |p| p.clone());
        bar.set_prefix(format!("{prefix}{label}"));
        let (b, d) = (bar.clone(), Arc::clone(&done));
        let ticker = thread::spawn(move || {
            let start = Instant::now();
            while !d.load(Ordering::Relaxed) {
                let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                b.set_position(ms.min(total_ms));
                b.set_message(format!(
                    "{:.1} / {:.1} s",
                    ms as f64 / 1e3,
                    total_ms as f64 / 1e3
                ));
                thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            bar: Some(bar),
            done,
            ticker: Some(ticker),
        }
    }

    /// Whether the bar is on screen (stderr is a terminal).
    pub(crate) fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// Prints a line above the bar (live interval reports); nothing when stderr is not a
    /// terminal.
    pub(crate) fn println(&self, line: &str) {
        if let Some(b) = &self.bar {
            b.println(line);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
