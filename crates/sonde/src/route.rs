//! Where a test goes, parsed once from the subcommand's `HOST[:PORT]`, `--from` and
//! `--secret-file`: a sonde agent, a real iperf3 or sockperf server (`iperf3://HOST`,
//! `sockperf://HOST`), or helper agents that run the test against the target themselves
//! (`--from`). Each test subcommand resolves its [`Route`] once and matches on it once.

use sonde_client::{FromHelpers, Iperf3Server, SockperfServer, Target};

use crate::auth::SecretOpt;
use crate::helpers::FromOpt;
use crate::source::Source;
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

/// Where one test goes: one of the client's typed targets, each run with
/// `sonde_client::run`.
#[derive(Debug)]
pub(crate) enum Route {
    /// This host runs the test against a sonde agent.
    Agent(Target),
    /// This host runs the test against a real iperf3 server.
    Iperf3(Iperf3Server),
    /// This host runs the test against a real sockperf server.
    Sockperf(SockperfServer),
    /// The helpers run the test against the target (as they reach it) all at once.
    Helpers(FromHelpers),
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
        source: &Source,
        sweep: bool,
    ) -> anyhow::Result<Self> {
        let helpers = from.map(|f| f.helpers(host, secret, sweep)).transpose()?;
        if let Some(helpers) = helpers.flatten() {
            if !source.is_default() {
                return Err(BadValue(
                    "-B, --bind-dev, --cport, -4 and -6 choose where this host's sockets come \
                     from; with --from the helpers open them"
                        .into(),
                )
                .into());
            }
            return Ok(Self::Helpers(FromHelpers {
                target: host.to_owned(),
                helpers,
            }));
        }
        direct(test, host, accepts, secret, source)
    }
}

/// The sonde agent at `host`, for `sonde test`, which tests nothing else and has no `--from`,
/// reached from `source`.
pub(crate) fn agent(
    test: &str,
    host: &str,
    secret: &SecretOpt,
    source: &Source,
) -> anyhow::Result<Target> {
    match Server::of(host) {
        Server::Agent => secret.resolve_from(host, source),
        _ => Err(cannot_test(test, host, &[])),
    }
}

/// What answers at `host` and its address, for a subcommand that can test the servers in
/// `accepts` besides a sonde agent.
fn direct(
    test: &str,
    host: &str,
    accepts: &[Server],
    secret: &SecretOpt,
    source: &Source,
) -> anyhow::Result<Route> {
    let server = Server::of(host);
    // `Server::of` found the scheme, so its parser has an answer.
    let no_target = || BadValue(format!("{host}: no target in it"));
    match server {
        Server::Agent => Ok(Route::Agent(secret.resolve_from(host, source)?)),
        _ if !accepts.contains(&server) => Err(cannot_test(test, host, accepts)),
        Server::Iperf3 => {
            let server =
                sonde_client::iperf3::target_in(host, source.family).ok_or_else(no_target)??;
            Ok(Route::Iperf3(sonde_client::Iperf3Server(
                server.0.with_source(source.client.clone()),
            )))
        }
        _ if !source.is_default() => Err(BadValue(format!(
            "-B, --bind-dev, --cport, -4 and -6 apply to tests against a sonde agent or an \
             iperf3 server; {host} is not one"
        ))
        .into()),
        Server::Sockperf => Ok(Route::Sockperf(
            sonde_client::sockperf::parse_target(host).ok_or_else(no_target)??,
        )),
    }
}

/// `sonde test` cannot test `host`, a server not in `accepts` (usage error, exit code 2).
fn cannot_test(test: &str, host: &str, accepts: &[Server]) -> anyhow::Error {
    let can: Vec<&str> = std::iter::once(Server::Agent)
        .chain(accepts.iter().copied())
        .map(Server::written)
        .collect();
    BadValue(format!(
        "sonde {test} cannot test {host}: its target is {}",
        can.join(" or ")
    ))
    .into()
}

/// A target this host tests itself: a sonde agent or a foreign server.
pub(crate) trait Direct {
    /// Its address and label.
    fn target(&self) -> &Target;
}

impl Direct for Target {
    fn target(&self) -> &Target {
        self
    }
}

impl Direct for Iperf3Server {
    fn target(&self) -> &Target {
        &self.0
    }
}

impl Direct for SockperfServer {
    fn target(&self) -> &Target {
        &self.0
    }
}

/// How results and progress bars name a direct target.
pub(crate) fn label(on: &impl Direct) -> &str {
    &on.target().label
}
