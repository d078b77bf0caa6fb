//! Where a test goes, parsed once from the subcommand's `HOST[:PORT]`, `--from` and
//! `--secret-file`: a sonde agent, a real iperf3 or sockperf server (`iperf3://HOST`,
//! `sockperf://HOST`), or helper agents that run the test against the target themselves
//! (`--from`). Each test subcommand resolves its [`Route`] once and matches on it once.

use sonde_client::Target;

use crate::auth::SecretOpt;
use crate::helpers::FromOpt;
use crate::units::BadValue;

/// What answers at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// A sonde agent (`sonde server`), proving the shared secret if one is given.
    Agent,
    /// A real `iperf3 -s`: `iperf3://HOST[:PORT]`, port 5201 by default.
    Iperf3,
    /// A real `sockperf server`: `sockperf://HOST[:PORT]`, port 11111 by default.
    Sockperf,
}

impl Server {
    /// What `host` names, from its scheme alone (nothing is resolved).
    pub(crate) fn of(host: &str) -> Self {
        let scheme = |scheme: &str| {
            host.get(..scheme.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
        };
        if scheme(sonde_client::iperf3::SCHEME) {
            Self::Iperf3
        } else if scheme(sonde_client::sockperf::SCHEME) {
            Self::Sockperf
        } else {
            Self::Agent
        }
    }

    /// How a user writes a target of this kind.
    fn written(self) -> &'static str {
        match self {
            Self::Agent => "HOST[:PORT] (a sonde agent)",
            Self::Iperf3 => "iperf3://HOST[:PORT]",
            Self::Sockperf => "sockperf://HOST[:PORT]",
        }
    }
}

/// Where one test goes.
#[derive(Debug)]
pub(crate) enum Route {
    /// This host runs the test against `target`, of the kind `server`.
    Direct { server: Server, target: Target },
    /// The helpers run the test against `target` (as they reach it) all at once.
    Helpers {
        target: String,
        helpers: Vec<Target>,
    },
}

impl Route {
    /// Resolves `host` for `sonde test`, which can test the servers in `accepts` besides a
    /// sonde agent, from the helpers of `from` where it has `--from`. `sweep` says whether the
    /// test is a `--sweep`, which helpers cannot run.
    ///
    /// # Errors
    /// A target of a kind the subcommand cannot test, `--from` with a foreign target or a
    /// sweep (usage errors, exit code 2); an address that does not resolve (exit code 3).
    pub(crate) fn resolve(
        test: &str,
        host: &str,
        accepts: &[Server],
        from: Option<&FromOpt>,
        secret: &SecretOpt,
        sweep: bool,
    ) -> anyhow::Result<Self> {
        let helpers = from.map(|f| f.helpers(host, secret, sweep)).transpose()?;
        if let Some(helpers) = helpers.flatten() {
            return Ok(Self::Helpers {
                target: host.to_owned(),
                helpers,
            });
        }
        let (server, target) = direct(test, host, accepts, secret)?;
        Ok(Self::Direct { server, target })
    }
}

/// The sonde agent at `host`, for `sonde test`, which tests nothing else and has no `--from`.
pub(crate) fn agent(test: &str, host: &str, secret: &SecretOpt) -> anyhow::Result<Target> {
    direct(test, host, &[], secret).map(|(_, target)| target)
}

/// What answers at `host` and its address, for a subcommand that can test the servers in
/// `accepts` besides a sonde agent.
fn direct(
    test: &str,
    host: &str,
    accepts: &[Server],
    secret: &SecretOpt,
) -> anyhow::Result<(Server, Target)> {
    let server = Server::of(host);
    let target = match server {
        Server::Agent => return Ok((server, secret.resolve(host)?)),
        _ if !accepts.contains(&server) => {
            let can: Vec<&str> = std::iter::once(Server::Agent)
                .chain(accepts.iter().copied())
                .map(Server::written)
                .collect();
            return Err(BadValue(format!(
                "sonde {test} cannot test {host}: its target is {}",
                can.join(" or ")
            ))
            .into());
        }
        Server::Iperf3 => sonde_client::iperf3::target(host),
        Server::Sockperf => sonde_client::sockperf::parse_target(host),
    };
    // `Server::of` found the scheme, so its parser has an answer.
    let target = target.ok_or_else(|| BadValue(format!("{host}: no target in it")))??;
    Ok((server, target))
}
