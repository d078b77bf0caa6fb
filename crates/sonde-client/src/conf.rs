//! `sonde conf`: this host's configuration and, given an agent, the agent's, as a test between
//! them would see them (each end's interface toward the other). Asking the agent costs one
//! hello and a `Describe` (with the proof of the shared secret when the agent requires one): its
//! `Description` carries its configuration, and no test is started.
//!
//! ```no_run
//! let target = sonde_client::resolve("127.0.0.1", 5300).unwrap();
//! let conf = sonde_client::conf(Some(&target)).unwrap();
//! println!("agent kernel {:?}", conf.hosts.server.and_then(|h| h.kernel_release));
//! ```

use sonde_report::{ConfResult, Hosts};

use crate::session::{self, Context};
use crate::{ClientError, Target};

/// Both ends' configuration: with `target`, this host for the interface toward it and the
/// agent as it describes itself; without, this host alone, every interface that is up.
pub fn conf(target: Option<&Target>) -> Result<ConfResult, ClientError> {
    let timestamp_unix_ms = crate::now_unix_ms();
    let mut described = true;
    let hosts = match target {
        None => Hosts {
            client: sonde_net::hostinfo::collect(env!("CARGO_PKG_VERSION"), &[]).ok(),
            server: None,
        },
        Some(target) => {
            // The hello first: an unreachable agent is an error before anything is collected.
            let host = session::hello(target)?.describe(target)?;
            described = host.is_some();
            Hosts {
                client: Context::this_host(target).client_host,
                server: host,
            }
        }
    };
    let mut result = ConfResult {
        sonde_version: env!("CARGO_PKG_VERSION").into(),
        timestamp_unix_ms,
        server: target.map(|t| t.label.clone()),
        hosts,
        warnings: Vec::new(),
        warning_codes: Vec::new(),
    };
    if !described {
        result.add(&sonde_report::Warning::ConfServerUnknown);
    }
    Ok(result)
}
