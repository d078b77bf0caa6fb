//! The project's own tasks, run as `cargo xtask TASK` (the alias is in `.cargo/config.toml`).
//!
//! `cargo xtask dist`: the static x86_64 musl release build, packaged three ways into
//! `target/dist/`: a `.deb`, an `.rpm` and a `.tar.gz`, each with the binary, its man pages, its
//! bash, zsh and fish completions, the `sonde server` systemd unit, the example configuration in
//! `/etc/sonde/` and the licence. docs/install.md ("Packages") is the user's side of it;
//! docs/deploy.md ("The systemd service") explains the unit.
//!
//! A separate crate so that its packaging dependencies stay out of the product's crates.

use std::process::ExitCode;

mod deb;
mod dist;
mod layout;
mod rpm_package;
mod tarball;

const USAGE: &str = "\
Usage: cargo xtask TASK

Tasks:
  dist   build the static x86_64 musl release binary (--profile dist) and write the .deb, the
         .rpm and the .tar.gz to target/dist/ (needs the x86_64-unknown-linux-musl target and
         musl-gcc, Debian's musl-tools)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["dist"] => dist::run(),
        ["-h" | "--help" | "help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
