//! `sonde man`: man pages (roff), generated from the same clap definition as `--help`, so the
//! pages cannot drift from the options the binary accepts.

use std::fs;
use std::path::{Path, PathBuf};

use clap::{Args, ValueHint};

use crate::output::print;
use crate::units::BadValue;

/// Man pages: `sonde.1` on stdout, or every page into a directory
///
/// The pages carry the same text as `--help`. Needs no network, no agent and no root (unless
/// DIR is a system directory).
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sonde man | man -l -                      read the top-level page now
  sonde man --dir /usr/local/share/man/man1 install every page (then `man sonde-latency`)
  sonde man --dir ~/.local/share/man/man1   one user (where `manpath` looks)

Exit codes:
    0  the page was printed, or every page was written
    2  usage error (a bad option, or DIR cannot be created or written)")]
pub(crate) struct Opt {
    /// Write sonde.1 and one page per subcommand (sonde-latency.1, ...) into DIR, creating it,
    /// and list the files written on stderr; without it, print sonde.1 on stdout
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath)]
    dir: Option<PathBuf>,
}

/// Writes the pages of `cmd`, the whole command line's definition.
pub(crate) fn run(opt: &Opt, cmd: clap::Command) -> anyhow::Result<()> {
    // `help` is clap's own subcommand, not a page: `sonde help X` is `sonde X --help`.
    let mut cmd = cmd.disable_help_subcommand(true);
    // Sets each subcommand's display name (`sonde-latency`), which names its page and file.
    cmd.build();
    match &opt.dir {
        None => {
            let mut page = Vec::new();
            page_of(cmd).render(&mut page)?;
            print(&String::from_utf8_lossy(&page))
        }
        Some(dir) => {
            fs::create_dir_all(dir)
                .map_err(|e| BadValue(format!("--dir: cannot create `{}`: {e}", dir.display())))?;
            write_pages(&cmd, dir)
        }
    }
}

/// The page of `cmd`, with sonde's name and version as its source (clap_mangen would put the
/// subcommand's own name there: "latency 0.1.0").
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(concat!("sonde ", env!("CARGO_PKG_VERSION")))
}

/// Writes the page of `cmd`, then those of its visible subcommands (and theirs), naming each
/// file on stderr as it is written.
fn write_pages(cmd: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    let man = page_of(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)?;
    // A directory that exists but cannot be written is the same mistake as one that cannot be
    // created: the DIR given is not usable.
    fs::write(&path, page)
        .map_err(|e| BadValue(format!("--dir: cannot write `{}`: {e}", path.display())))?;
    eprintln!("{}", path.display());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    Ok(())
}
