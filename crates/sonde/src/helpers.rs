//! `--from HOST`: the test runs from helper agents (`sonde server --helper`) against the target,
//! all at once, instead of from this host.

use clap::Args;
use sonde_client::Target;

/// `--from`, flattened into `pps`, `throughput` and `latency`.
#[derive(Debug, Args)]
pub(crate) struct FromOpt {
    /// Run the test from this helper instead of from this host (repeat for several: they start
    /// together): the address, HOST or HOST:PORT, of a sonde agent started with `--helper` and the shared secret
    /// this client proves (--secret-file, SONDE_SECRET); it runs the test against the target
    /// itself, so the target is named as the helpers reach it. The result holds all helpers'
    /// figures together (what the target received from them over the common window) and each
    /// helper's share, with how far apart their starts were
    #[arg(long = "from", value_name = "HOST[:PORT]")]
    from: Vec<String>,
}

impl FromOpt {
    /// Whether no `--from` was given.
    pub(crate) fn is_empty(&self) -> bool {
        self.from.is_empty()
    }

    /// The helpers, resolved with the secret to prove to them; `None` without `--from`.
    pub(crate) fn helpers(
        &self,
        target: &str,
        secret: &crate::auth::SecretOpt,
        sweep: bool,
    ) -> anyhow::Result<Option<Vec<Target>>> {
        if self.from.is_empty() {
            return Ok(None);
        }
        if target.contains("://") {
            return Err(crate::units::BadValue(format!(
                "--from runs the test from sonde agents against a sonde agent, not {target}"
            ))
            .into());
        }
        if sweep {
            return Err(crate::units::BadValue(
                "--sweep and --from cannot be combined: run one --from test per value".into(),
            )
            .into());
        }
        self.from
            .iter()
            .map(|h| secret.resolve(h))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(Some)
    }
}
