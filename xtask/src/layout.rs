//! What the packages hold and where each file goes: one list, the same in the three formats but
//! for zsh's completion directory, which Debian names differently.

use std::io::Write;

use flate2::{Compression, GzBuilder};

/// The `sonde server` unit (deploy/packages/sonde.service; docs/deploy.md explains it).
pub(crate) const UNIT: &str = include_str!("../../deploy/packages/sonde.service");
/// The example `/etc/sonde/sonde.env` the unit reads.
pub(crate) const ENV_FILE: &str = include_str!("../../deploy/packages/sonde.env");
/// The shell that makes `/etc/sonde/secret` at install, unless there is one.
pub(crate) const MAKE_SECRET: &str = include_str!("../../deploy/packages/make-secret.sh");

/// The paths the unit and the scripts name.
pub(crate) const BINARY_PATH: &str = "/usr/bin/sonde";
pub(crate) const UNIT_PATH: &str = "/usr/lib/systemd/system/sonde.service";
pub(crate) const ENV_PATH: &str = "/etc/sonde/sonde.env";
pub(crate) const COPYRIGHT_PATH: &str = "/usr/share/doc/sonde/copyright";

const SUMMARY: &str = "network latency, throughput, packet and connection rate measurement";
const DESCRIPTION: &str = "\
sonde measures a network path between two hosts: round-trip latency as HDR
histograms (closed- and open-loop), TCP and UDP throughput, UDP packet rate,
TCP connection rate and path MTU, with stated units and honest warnings.
It also answers iperf3 and sockperf clients. This package holds the static
binary, its man pages and shell completions, and a hardened systemd service
for its agent (sonde server).";

/// The one-line summary and the longer description, for the package managers.
pub(crate) fn summary() -> &'static str {
    SUMMARY
}

pub(crate) fn description() -> &'static str {
    DESCRIPTION
}

/// The three packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Deb,
    Rpm,
    Tarball,
}

/// What a file is to the package manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Replaced on upgrade.
    Plain,
    /// The administrator's to edit: a conffile in the .deb, `%config(noreplace)` in the .rpm.
    Config,
    /// The licence: `%license` in the .rpm.
    Licence,
}

/// One file of a package.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Absolute: `/usr/bin/sonde`.
    pub(crate) path: String,
    pub(crate) mode: u32,
    pub(crate) data: Vec<u8>,
    pub(crate) kind: Kind,
}

/// What the built binary makes of itself: its bytes, its man pages and completion scripts.
#[derive(Debug, Clone)]
pub(crate) struct Generated {
    pub(crate) binary: Vec<u8>,
    /// File name (`sonde-latency.1`) and roff text, as `sonde man --dir` writes them.
    pub(crate) man_pages: Vec<(String, Vec<u8>)>,
    pub(crate) bash: Vec<u8>,
    pub(crate) zsh: Vec<u8>,
    pub(crate) fish: Vec<u8>,
}

/// The licence texts the copyright file carries.
#[derive(Debug, Clone)]
pub(crate) struct Licences {
    pub(crate) mit: String,
    pub(crate) apache: String,
}

/// Where zsh looks for completion functions: Debian's zsh has `vendor-completions` in its
/// `fpath` (and not `site-functions`); Fedora's, and zsh built from source, `site-functions`.
fn zsh_dir(format: Format) -> &'static str {
    match format {
        Format::Deb => "/usr/share/zsh/vendor-completions",
        Format::Rpm | Format::Tarball => "/usr/share/zsh/site-functions",
    }
}

/// Every file of a package in `format`, in a fixed order.
pub(crate) fn entries(generated: &Generated, licences: &Licences, format: Format) -> Vec<Entry> {
    let file = |path: &str, mode, data: Vec<u8>, kind| Entry {
        path: path.to_owned(),
        mode,
        data,
        kind,
    };
    let mut all = vec![file(
        BINARY_PATH,
        0o755,
        generated.binary.clone(),
        Kind::Plain,
    )];
    let mut pages: Vec<_> = generated.man_pages.iter().collect();
    pages.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, roff) in pages {
        let path = format!("/usr/share/man/man1/{name}.gz");
        all.push(file(&path, 0o644, gzip(roff), Kind::Plain));
    }
    all.push(file(
        "/usr/share/bash-completion/completions/sonde",
        0o644,
        generated.bash.clone(),
        Kind::Plain,
    ));
    let zsh = format!("{}/_sonde", zsh_dir(format));
    all.push(file(&zsh, 0o644, generated.zsh.clone(), Kind::Plain));
    all.push(file(
        "/usr/share/fish/vendor_completions.d/sonde.fish",
        0o644,
        generated.fish.clone(),
        Kind::Plain,
    ));
    all.push(file(UNIT_PATH, 0o644, UNIT.into(), Kind::Plain));
    all.push(file(ENV_PATH, 0o644, ENV_FILE.into(), Kind::Config));
    all.push(file(
        COPYRIGHT_PATH,
        0o644,
        copyright(licences, format).into_bytes(),
        Kind::Licence,
    ));
    all
}

/// Every directory above the files, parents first, each once (`/usr`, `/usr/bin`, ...).
pub(crate) fn directories(entries: &[Entry]) -> Vec<String> {
    let mut dirs = std::collections::BTreeSet::new();
    for e in entries {
        let mut at = 0;
        while let Some(i) = e.path[at + 1..].find('/') {
            at += 1 + i;
            dirs.insert(e.path[..at].to_owned());
        }
    }
    // Sorted, a parent comes before its children (a prefix sorts first).
    dirs.into_iter().collect()
}

/// gzip at the best level, with no name and no time in the header, so that the same page gives
/// the same bytes (what Debian's dh_compress does with `gzip -9n`).
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = GzBuilder::new().write(Vec::new(), Compression::best());
    out.write_all(data).expect("writing to a Vec cannot fail");
    out.finish().expect("writing to a Vec cannot fail")
}

/// `/usr/share/doc/sonde/copyright` in Debian's machine-readable format (DEP-5): sonde's licence,
/// with the texts in full (`sonde report`'s HTML embeds only sonde's own script and styles); the .deb points to
/// Debian's own copy of the Apache licence instead, as Debian policy asks (12.5), while the
/// .rpm and the tarball go to systems without /usr/share/common-licenses.
pub(crate) fn copyright(licences: &Licences, format: Format) -> String {
    let mut out = String::from(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: sonde\n\
         Comment: The binary is statically linked: it also holds the Rust crates listed in\n \
         the source's Cargo.lock (each under its own licence, MIT or Apache-2.0 for\n \
         most), SQLite (public domain) and musl libc (MIT).\n\
         \n\
         Files: *\n\
         Copyright: 2026 the sonde developers\n\
         License: MIT or Apache-2.0\n",
    );
    let apache = match format {
        Format::Deb => "Apache License, Version 2.0\n\n\
                        On Debian systems, the full text of the Apache License, Version 2.0 is in\n\
                        /usr/share/common-licenses/Apache-2.0.\n"
            .to_owned(),
        Format::Rpm | Format::Tarball => licences.apache.clone(),
    };
    for (name, text) in [("MIT", &licences.mit), ("Apache-2.0", &apache)] {
        out.push_str("\nLicense: ");
        out.push_str(name);
        out.push('\n');
        out.push_str(&licence_body(text));
    }
    out
}

/// A licence text as a DEP-5 field's continuation lines: each line indented by one space, an
/// empty line written ` .`.
fn licence_body(text: &str) -> String {
    let mut out = String::new();
    for line in text.trim_matches('\n').lines() {
        let line = line.trim_end();
        if line.is_empty() {
            out.push_str(" .\n");
        } else {
            out.push(' ');
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn generated() -> Generated {
        Generated {
            binary: b"\x7fELF binary".to_vec(),
            man_pages: vec![
                ("sonde-server.1".into(), b".TH sonde-server 1\n".to_vec()),
                ("sonde.1".into(), b".TH sonde 1\n".to_vec()),
            ],
            bash: b"complete -F _sonde sonde\n".to_vec(),
            zsh: b"#compdef sonde\n".to_vec(),
            fish: b"complete -c sonde\n".to_vec(),
        }
    }

    pub(crate) fn licences() -> Licences {
        Licences {
            mit: "MIT License\n\nPermission is hereby granted\n".into(),
            apache: "Apache License\n".into(),
        }
    }

    fn paths(format: Format) -> Vec<String> {
        entries(&generated(), &licences(), format)
            .into_iter()
            .map(|e| e.path)
            .collect()
    }

    #[test]
    fn each_file_goes_where_the_system_looks() {
        assert_eq!(
            paths(Format::Deb),
            [
                "/usr/bin/sonde",
                "/usr/share/man/man1/sonde-server.1.gz",
                "/usr/share/man/man1/sonde.1.gz",
                "/usr/share/bash-completion/completions/sonde",
                "/usr/share/zsh/vendor-completions/_sonde",
                "/usr/share/fish/vendor_completions.d/sonde.fish",
                "/usr/lib/systemd/system/sonde.service",
                "/etc/sonde/sonde.env",
                "/usr/share/doc/sonde/copyright",
            ]
        );
        let rpm = paths(Format::Rpm);
        assert!(rpm.contains(&"/usr/share/zsh/site-functions/_sonde".to_owned()));
        assert_eq!(rpm.len(), paths(Format::Deb).len());
    }

    #[test]
    fn only_the_configuration_is_the_administrators() {
        let all = entries(&generated(), &licences(), Format::Deb);
        let config: Vec<_> = all.iter().filter(|e| e.kind == Kind::Config).collect();
        assert_eq!(config.len(), 1);
        assert_eq!(config[0].path, ENV_PATH);
        let binary = all.iter().find(|e| e.path == BINARY_PATH).unwrap();
        assert_eq!(binary.mode, 0o755);
        assert!(all
            .iter()
            .filter(|e| e.path != BINARY_PATH)
            .all(|e| e.mode == 0o644));
    }

    #[test]
    fn man_pages_are_gzipped_and_the_same_bytes_each_time() {
        let all = entries(&generated(), &licences(), Format::Rpm);
        let page = all.iter().find(|e| e.path.ends_with("sonde.1.gz")).unwrap();
        assert_eq!(page.data[..2], [0x1f, 0x8b]);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&page.data[..]), &mut text)
            .unwrap();
        assert_eq!(text, ".TH sonde 1\n");
        assert_eq!(gzip(b"x"), gzip(b"x"));
    }

    #[test]
    fn directories_come_parents_first() {
        let all = entries(&generated(), &licences(), Format::Deb);
        let dirs = directories(&all);
        assert_eq!(dirs[0], "/etc");
        assert!(dirs.contains(&"/etc/sonde".to_owned()));
        for (i, d) in dirs.iter().enumerate() {
            if let Some(parent) = d.rsplit_once('/').map(|(p, _)| p).filter(|p| !p.is_empty()) {
                let at = dirs.iter().position(|x| x == parent).unwrap();
                assert!(at < i, "{parent} after {d}");
            }
        }
    }

    #[test]
    fn copyright_is_dep5_with_the_texts_in_full() {
        let text = copyright(&licences(), Format::Rpm);
        let deb = copyright(&licences(), Format::Deb);
        assert!(deb.contains(
            "\nLicense: Apache-2.0\n Apache License, Version 2.0\n .\n On Debian systems"
        ));
        assert!(deb.contains("/usr/share/common-licenses/Apache-2.0"));
        assert!(text.starts_with(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        ));
        assert!(text.contains("\nLicense: MIT\n MIT License\n .\n Permission is hereby granted\n"));
        assert!(text.contains("\nLicense: Apache-2.0\n Apache License\n"));
        // sonde's own licences only: the report embeds no third-party script.
        assert_eq!(text.matches("\nLicense: ").count(), 3, "{text}");
        // Every continuation line starts with a space: no line of a licence reads as a field.
        let body = text.split("\nLicense: MIT\n").nth(1).unwrap();
        assert!(body
            .lines()
            .take_while(|l| !l.is_empty())
            .all(|l| l.starts_with(' ')));
    }

    /// The unit's promises, the ones docs/deploy.md explains.
    #[test]
    fn the_unit_is_hardened_and_runs_the_installed_binary() {
        let setting = |key: &str| {
            UNIT.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            setting("ExecStart"),
            ["/usr/bin/sonde server --secret-file %d/secret $SONDE_SERVER_ARGS"]
        );
        assert_eq!(setting("LoadCredential"), ["secret:/etc/sonde/secret"]);
        assert_eq!(
            setting("EnvironmentFile"),
            [format!("-{ENV_PATH}").as_str()]
        );
        for (key, value) in [
            ("DynamicUser", "yes"),
            ("CapabilityBoundingSet", ""),
            ("AmbientCapabilities", ""),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("Restart", "on-failure"),
        ] {
            assert_eq!(setting(key), [value], "{key}");
        }
        assert!(ENV_FILE.lines().any(|l| l == "SONDE_SERVER_ARGS=\"\""));
    }
}
