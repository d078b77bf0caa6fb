//! The `sonde` binary and its agent on loopback: every subcommand as users run it, the
//! context each result carries, connection rate, latency's inner view and the agent under
//! faults. One module per area; each file's own doc comment says what it covers.
//!
//! Only 127.0.0.1 (and, for a few tests that need root, namespaces they create in
//! 198.18.0.0/15); every loop is bounded in count and time.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod context;
mod crr;
mod inner;
mod mesh;
mod mtu;
mod server_faults;
