//! `--secret-file`: the shared secret of an agent that admits only clients proving it
//! (`sonde server --secret-file`), for the agent and for every client subcommand.

use std::path::{Path, PathBuf};

use clap::Args;
use sonde_client::Target;
use sonde_wire::auth::Secret;

use crate::units::BadValue;

/// The environment variable that holds the secret itself when no `--secret-file` is given.
pub(crate) const SECRET_ENV: &str = "SONDE_SECRET";

/// The client's `--secret-file`, flattened into each test subcommand's options.
#[derive(Debug, Args)]
pub(crate) struct SecretOpt {
    /// File holding the secret of an agent started with --secret-file (one trailing line end is
    /// ignored). Without it, the SONDE_SECRET environment variable holds the secret itself, if
    /// set. The secret never crosses the network: the client proves it with an HMAC over
    /// nonces. Not used for sockperf:// and iperf3:// targets
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
}

impl SecretOpt {
    /// Resolves a sonde agent's `HOST[:PORT]`, with the secret to prove to it.
    pub(crate) fn resolve(&self, host: &str) -> anyhow::Result<Target> {
        let secret = load(self.secret_file.as_deref())?;
        Ok(sonde_client::resolve(host, sonde_client::DEFAULT_PORT)?.with_secret(secret))
    }

    /// Resolves a sonde agent's `HOST[:PORT]` in `source`'s family, with the secret to prove
    /// to it, reached from `source`.
    pub(crate) fn resolve_from(
        &self,
        host: &str,
        source: &crate::source::Source,
    ) -> anyhow::Result<Target> {
        let secret = load(self.secret_file.as_deref())?;
        Ok(
            sonde_client::resolve_in(host, sonde_client::DEFAULT_PORT, source.family)?
                .with_secret(secret)
                .with_source(source.client.clone()),
        )
    }
}

/// The secret from `file`, else from `SONDE_SECRET`; `None` when neither is given.
pub(crate) fn load(file: Option<&Path>) -> Result<Option<Secret>, BadValue> {
    let (bytes, from) = match file {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                BadValue(format!(
                    "cannot read the secret file {}: {e}",
                    path.display()
                ))
            })?;
            (bytes, format!("the secret file {}", path.display()))
        }
        None => match std::env::var_os(SECRET_ENV) {
            Some(v) => (v.into_encoded_bytes(), SECRET_ENV.to_owned()),
            None => return Ok(None),
        },
    };
    Secret::from_text(bytes)
        .map(Some)
        .map_err(|e| BadValue(format!("{from}: {e}")))
}
