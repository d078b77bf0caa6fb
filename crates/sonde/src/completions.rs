//! `sonde completions`: the shell completion script, generated from the same clap definition as
//! `--help`, so completions cannot drift from the options the binary accepts.

use clap::Args;
use clap_complete::Shell;

use crate::output::print;

/// Shell completion script on stdout (bash, zsh, fish, elvish, powershell)
///
/// Completes subcommands, options and the values of options that take a fixed set. Needs no
/// network, no agent and no root: redirect the output to where the shell looks for it.
#[derive(Debug, Args)]
#[command(after_help = "\
Where to put it (then open a new shell):
  bash        sonde completions bash > /etc/bash_completion.d/sonde
              (one user: ~/.local/share/bash-completion/completions/sonde)
  zsh         sonde completions zsh > /usr/local/share/zsh/site-functions/_sonde
              (one user: any directory in $fpath, e.g. ~/.zfunc/_sonde with
              `fpath+=~/.zfunc` before `compinit` in ~/.zshrc)
  fish        sonde completions fish > ~/.config/fish/completions/sonde.fish
  elvish      sonde completions elvish >> ~/.config/elvish/rc.elv
  powershell  sonde completions powershell >> $PROFILE

Exit codes:
    0  the script was printed
    2  usage error (a shell not in the list)")]
pub(crate) struct Opt {
    /// The shell to complete for
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

/// Prints the script for `cmd`, the whole command line's definition.
pub(crate) fn run(opt: &Opt, mut cmd: clap::Command) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(opt.shell, &mut cmd, "sonde", &mut script);
    // The script is built from our own help text, which is UTF-8.
    print(&String::from_utf8_lossy(&script))
}
