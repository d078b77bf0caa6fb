//! `sonde`: network latency, throughput and packet rate from one binary and one port.
//! The binary parses, runs, and maps errors to exit codes; the work is in the library crates.

mod auth;
mod cli;
mod compare;
mod completions;
mod conf;
mod crr;
mod diagnose;
mod exit;
mod helpers;
mod interrupt;
mod latency;
mod load;
mod man;
mod mesh;
mod mtu;
mod output;
mod plan;
mod pps;
mod publish;
mod quick;
mod report;
mod results;
mod route;
mod runner;
mod save;
mod select;
mod server;
mod sockopt;
mod source;
mod spec;
mod sweep;
mod throughput;
mod units;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = <cli::Cli as clap::Parser>::parse();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sonde: {e:#}");
            ExitCode::from(exit::exit_code(&e))
        }
    }
}
