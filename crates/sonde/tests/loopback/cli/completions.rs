//! Shell completions and man pages, generated from the clap definition.

use super::*;

// ---------------------------------------------------------------------------------------------
// Shell completions and man pages
// ---------------------------------------------------------------------------------------------

/// The subcommands `sonde --help` lists under "Commands:", in order (clap's `help` included),
/// so these tests follow every subcommand added later without being edited.
fn listed_subcommands() -> Vec<String> {
    let help = run_ok(&["--help"]);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // A name starts two columns in; a wrapped description is indented further.
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for expected in ["latency", "completions", "man"] {
        assert!(
            names.iter().any(|n| n == expected),
            "`{expected}` not found among the commands of `sonde --help` ({names:?}):\n{help}"
        );
    }
    names
}

/// The subcommands that get a man page: all but clap's `help` (`sonde help X` is `sonde X
/// --help`, which has its page).
fn subcommands_with_pages() -> Vec<String> {
    listed_subcommands()
        .into_iter()
        .filter(|n| n != "help")
        .collect()
}

/// The words of a script: runs of letters, digits and `-`.
fn words(script: &str) -> std::collections::BTreeSet<&str> {
    script
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn bash_completions_name_every_subcommand() {
    let _file = crate::common::file_lock(module_path!());
    let script = run_ok(&["completions", "bash"]);
    let words = words(&script);
    for name in listed_subcommands() {
        assert!(
            words.contains(name.as_str()),
            "the bash script never names `{name}`"
        );
    }
    assert!(
        script
            .lines()
            .any(|l| l.trim_start().starts_with("complete -F ") && l.trim_end().ends_with(" sonde")),
        "the bash script registers no completion for `sonde`:\n{script}"
    );
}

#[test]
fn bash_completes_the_subcommands_and_their_options() {
    let _file = crate::common::file_lock(module_path!());
    if !common::require_or_skip(
        "bash_completes_the_subcommands_and_their_options",
        &[common::Need::Cmd("bash")],
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("sonde.bash");
    std::fs::write(&path, run_ok(&["completions", "bash"])).expect("write the script");
    // What bash does on TAB: set COMP_WORDS/COMP_CWORD and call the function with the command,
    // the word being completed and the word before it.
    let complete = |line: &[&str]| -> Vec<String> {
        let quoted: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
        let script = format!(
            "source '{}' && COMP_WORDS=({}) && COMP_CWORD={} && _sonde sonde '{}' '{}' && \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path.display(),
            quoted.join(" "),
            line.len() - 1,
            line[line.len() - 1],
            line[line.len() - 2],
        );
        let out = StdCommand::new("bash")
            .args(["--norc", "--noprofile", "-c", &script])
            .output()
            .expect("run bash");
        assert!(
            out.status.success(),
            "bash failed on the script: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let first = complete(&["sonde", ""]);
    for name in listed_subcommands() {
        assert!(
            first.contains(&name),
            "`sonde <TAB>` does not offer `{name}`: {first:?}"
        );
    }
    assert_eq!(complete(&["sonde", "compl"]), ["completions"]);
    let man = complete(&["sonde", "man", "--"]);
    assert!(
        man.iter().any(|w| w == "--dir"),
        "`sonde man --<TAB>`: {man:?}"
    );
    let shells = complete(&["sonde", "completions", ""]);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        assert!(
            shells.iter().any(|w| w == shell),
            "`sonde completions <TAB>` does not offer `{shell}`: {shells:?}"
        );
    }
}

#[test]
fn zsh_fish_elvish_and_powershell_completions_are_scripts_for_their_shell() {
    let _file = crate::common::file_lock(module_path!());
    let zsh = run_ok(&["completions", "zsh"]);
    // zsh's compinit loads a file from $fpath only if its first line is `#compdef NAME`.
    assert_eq!(zsh.lines().next(), Some("#compdef sonde"), "zsh:\n{zsh}");
    let fish = run_ok(&["completions", "fish"]);
    let fish_lines: Vec<&str> = fish
        .lines()
        .filter(|l| l.starts_with("complete -c sonde "))
        .collect();
    assert!(
        !fish_lines.is_empty(),
        "fish: no `complete -c sonde`:\n{fish}"
    );
    for name in subcommands_with_pages() {
        let offered = format!("-a \"{name}\"");
        assert!(
            fish_lines.iter().any(|l| l.contains(&offered)),
            "fish never offers `{name}`"
        );
    }
    for shell in ["elvish", "powershell"] {
        let script = run_ok(&["completions", shell]);
        assert!(
            words(&script).contains("latency"),
            "{shell}: no subcommands:\n{script}"
        );
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    let r = run(&["completions", "tcsh"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "stdout: {}", r.stdout);
    assert!(
        r.stderr.contains("tcsh") && r.stderr.contains("bash"),
        "the error should name the value and the shells there are: {}",
        r.stderr
    );
    let r = run(&["completions"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
}

/// A man page is roff: clap_mangen starts with a `.ie` string definition, then `.TH`.
fn assert_roff(page: &str, title: &str) {
    let first = page.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(".TH") || first.starts_with(".ie"),
        "`{title}` is not roff:\n{page}"
    );
    let th = format!(".TH {title} 1 ");
    assert!(
        page.lines().any(|l| l.starts_with(&th)),
        "no `{th}` header in:\n{page}"
    );
}

#[test]
fn man_prints_the_top_level_page_naming_every_subcommand() {
    let _file = crate::common::file_lock(module_path!());
    let page = run_ok(&["man"]);
    assert_roff(&page, "sonde");
    for name in subcommands_with_pages() {
        // roff escapes `-`; the page points at `sonde-NAME(1)`.
        let reference = format!("sonde\\-{name}(1)");
        assert!(page.contains(&reference), "no `{reference}` in:\n{page}");
    }
    assert!(
        !page.contains("sonde\\-help(1)"),
        "the page points at a sonde-help page that `man --dir` does not write"
    );
}

#[test]
fn man_dir_writes_a_page_per_subcommand() {
    let _file = crate::common::file_lock(module_path!());
    let tmp = tempfile::tempdir().expect("a temporary directory");
    // Two levels that do not exist yet: `--dir` creates them.
    let dir = tmp.path().join("share").join("man1");
    let dir_arg = dir.to_str().expect("a UTF-8 temporary path");
    let r = run(&["man", "--dir", dir_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "stdout: {}", r.stdout);

    let mut expected: std::collections::BTreeSet<String> = subcommands_with_pages()
        .iter()
        .map(|n| format!("sonde-{n}.1"))
        .collect();
    expected.insert("sonde.1".to_owned());
    // Nested subcommands have pages of their own.
    for sub in ["show", "export", "rm", "push"] {
        expected.insert(format!("sonde-results-{sub}.1"));
    }
    for sub in ["check", "run"] {
        expected.insert(format!("sonde-plan-{sub}.1"));
    }
    expected.insert("sonde-mesh-diagnose.1".to_owned());
    expected.insert("sonde-mesh-publish.1".to_owned());
    let written: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("--dir was created")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(written, expected);

    let listed: std::collections::BTreeSet<&str> = r.stderr.lines().collect();
    for file in &expected {
        let path = dir.join(file);
        assert!(
            listed.contains(path.to_str().unwrap_or_default()),
            "stderr does not list {}:\n{}",
            path.display(),
            r.stderr
        );
        let page = std::fs::read_to_string(&path).expect("a page");
        assert_roff(&page, file.trim_end_matches(".1"));
    }
    assert_eq!(listed.len(), expected.len(), "stderr:\n{}", r.stderr);

    // The top-level page is the same on stdout as in DIR.
    assert_eq!(
        std::fs::read_to_string(dir.join("sonde.1")).expect("sonde.1"),
        run_ok(&["man"])
    );
}

#[test]
fn a_man_dir_that_cannot_be_created_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    let tmp = tempfile::tempdir().expect("a temporary directory");
    // Under a regular file: not creatable, even as root.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "").expect("create a file");
    let dir = file.join("man1");
    let r = run(&[
        "man",
        "--dir",
        dir.to_str().expect("a UTF-8 temporary path"),
    ]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "stdout: {}", r.stdout);
    assert_eq!(
        r.stderr.lines().count(),
        1,
        "one line, no page listed: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains("cannot create") && r.stderr.contains(&*dir.to_string_lossy()),
        "the error should say which directory could not be created: {}",
        r.stderr
    );
}
