//! Exit codes: the table every test subcommand's `--help` shows, and the code for an error.

/// Exit codes, shown in every `--help`, the README and docs/exit-codes.md. A macro so it can be `concat!`ed into
/// each subcommand's long help.
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
    0  the test ran and its result was printed
    1  the test started but failed (lost connection, the agent ended it)
    2  usage error (bad option or value)
    3  could not reach the server (resolve, connect, not a sonde agent or not the
       iperf3/sockperf server the URL names, UDP blocked, no reply)
    4  the server refused the test (busy, over its limits, other protocol version,
       no or wrong shared secret)
  130  interrupted (Ctrl-C; the agent ends the session on its side; every test but
       iperf3:// prints and saves what it measured until then)
  143  a test stopped by SIGTERM (as for 130)"
    };
}
pub(crate) use exit_codes;

/// The exit codes of the test subcommands, for their `after_help`.
pub(crate) const EXIT_CODES: &str = exit_codes!();

/// The process exit code for an error from `run`.
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(c) = e.downcast_ref::<sonde_client::ClientError>() {
        return c.exit_code();
    }
    if let Some(i) = e.downcast_ref::<crate::interrupt::Interrupted>() {
        return i.exit_code();
    }
    if e.downcast_ref::<crate::units::BadValue>().is_some() {
        return 2;
    }
    1
}
