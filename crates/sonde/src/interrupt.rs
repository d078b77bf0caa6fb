//! Ctrl-C and SIGTERM during a test: the test stops early as its planned end would, what it
//! measured until then is printed and saved (marked `interrupted`), and sonde exits 130 (SIGINT)
//! or 143 (SIGTERM). A second signal ends the process at once with the same code.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};

/// The signals seen so far.
pub(crate) struct Interrupt {
    raised: Arc<AtomicBool>,
    sigterm: Arc<AtomicBool>,
}

static INTERRUPT: OnceLock<Interrupt> = OnceLock::new();

/// Installs the handlers (once per process) and returns their flags. Until then a signal ends
/// the process as it always did.
pub(crate) fn install() -> &'static Interrupt {
    INTERRUPT.get_or_init(|| {
        let raised = Arc::new(AtomicBool::new(false));
        let sigterm = Arc::new(AtomicBool::new(false));
        for (signal, code) in [(SIGINT, 130), (SIGTERM, 143)] {
            // Registered first, so it sees the flag as the previous signal left it: a second
            // signal exits at once.
            let _ =
                signal_hook::flag::register_conditional_shutdown(signal, code, Arc::clone(&raised));
            let _ = signal_hook::flag::register(signal, Arc::clone(&raised));
        }
        let _ = signal_hook::flag::register(SIGTERM, Arc::clone(&sigterm));
        Interrupt { raised, sigterm }
    })
}

impl Interrupt {
    /// Raised by the first signal: what the test loops watch.
    pub(crate) fn flag(&self) -> &AtomicBool {
        &self.raised
    }

    /// `Err(Interrupted)` once a signal came: after a run was printed and saved, it ends the
    /// command with the signal's exit code (and stops a --repeat).
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.raised.load(Ordering::Relaxed) {
            Err(Interrupted {
                sigterm: self.sigterm.load(Ordering::Relaxed),
            }
            .into())
        } else {
            Ok(())
        }
    }
}

/// The command ended because of a signal.
#[derive(Debug)]
pub(crate) struct Interrupted {
    sigterm: bool,
}

impl Interrupted {
    /// 130 for Ctrl-C, 143 for SIGTERM (128 + the signal's number, as shells report them).
    pub(crate) fn exit_code(&self) -> u8 {
        if self.sigterm {
            143
        } else {
            130
        }
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by = if self.sigterm { "SIGTERM" } else { "Ctrl-C" };
        write!(
            f,
            "interrupted by {by}: the result covers what was measured until then (marked interrupted)"
        )
    }
}

impl std::error::Error for Interrupted {}
