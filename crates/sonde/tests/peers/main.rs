//! sonde against the real programs people run beside it: Debian's `iperf3` and `sockperf`
//! as clients and servers, headless `chromium` opening `sonde report`'s page, the container
//! image's static binary and the deployment's offline checks, and the Windows build under
//! `wine`. One module per peer; each file's own doc comment says what it checks.

#[path = "../common/mod.rs"]
mod common;

mod deploy;
mod iperf3_client;
mod iperf3_server;
mod report;
mod sockperf;
mod windows;
