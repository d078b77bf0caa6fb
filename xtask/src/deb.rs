//! The `.deb`: an `ar` archive of `debian-binary` ("2.0"), `control.tar.gz` (the package's
//! fields, its conffiles, the files' MD5 sums and the maintainer scripts) and `data.tar.gz` (the
//! files), as deb(5) describes it. Written here with the `ar`, `tar` and `flate2` crates rather
//! than cargo-deb's library, whose API is its command line's internals (it reads the crate's
//! `[package.metadata.deb]` and runs its own build); every file here is made by the xtask.

use std::fmt::Write as _;
use std::io::Write as _;

use anyhow::Result;
use flate2::write::GzEncoder;
use flate2::Compression;
use md5::{Digest, Md5};

use crate::layout::{self, Entry, Kind, MAKE_SECRET};

/// Debian's name for x86_64.
const ARCH: &str = "amd64";
/// The package revision: the first packaging of each upstream version.
pub(crate) const REVISION: &str = "1";

/// The file name Debian's tools give it: `sonde_0.1.0-1_amd64.deb`.
pub(crate) fn file_name(version: &str) -> String {
    format!("sonde_{version}-{REVISION}_{ARCH}.deb")
}

/// The `.deb` of `entries`, as bytes.
pub(crate) fn build(entries: &[Entry], version: &str, mtime: u64) -> Result<Vec<u8>> {
    let mut entries = entries.to_vec();
    entries.push(Entry {
        path: CHANGELOG_PATH.into(),
        mode: 0o644,
        data: layout::gzip(changelog(version, mtime).as_bytes()),
        kind: Kind::Plain,
    });
    let entries = &entries[..];
    let mut data = Tarball::new(mtime);
    for dir in layout::directories(entries) {
        data.dir(&format!(".{dir}/"))?;
    }
    for e in entries {
        data.file(&format!(".{}", e.path), e.mode, &e.data)?;
    }
    let installed_kib = entries
        .iter()
        .map(|e| e.data.len().div_ceil(1024))
        .sum::<usize>();

    let mut control = Tarball::new(mtime);
    control.dir("./")?;
    control.file(
        "./control",
        0o644,
        self::control(version, installed_kib).as_bytes(),
    )?;
    control.file("./conffiles", 0o644, conffiles(entries).as_bytes())?;
    control.file("./md5sums", 0o644, md5sums(entries).as_bytes())?;
    for (name, script) in [
        ("postinst", postinst()),
        ("prerm", PRERM.into()),
        ("postrm", POSTRM.into()),
    ] {
        control.file(&format!("./{name}"), 0o755, script.as_bytes())?;
    }

    let mut deb = ar::Builder::new(Vec::new());
    for (name, bytes) in [
        ("debian-binary", b"2.0\n".to_vec()),
        ("control.tar.gz", control.finish()?),
        ("data.tar.gz", data.finish()?),
    ] {
        let mut header = ar::Header::new(name.as_bytes().to_vec(), bytes.len() as u64);
        header.set_mode(0o100_644);
        header.set_mtime(mtime);
        deb.append(&header, &bytes[..])?;
    }
    Ok(deb.into_inner()?)
}

/// Debian policy (12.7) wants a changelog in every package that is not Debian-native.
pub(crate) const CHANGELOG_PATH: &str = "/usr/share/doc/sonde/changelog.Debian.gz";

/// One entry, for this packaging of `version` (deb-changelog(5)), dated `mtime`.
fn changelog(version: &str, mtime: u64) -> String {
    format!(
        "sonde ({version}-{REVISION}) unstable; urgency=medium\n\n  \
         * Packaged by `cargo xtask dist` from sonde {version}.\n\n \
         -- the sonde developers <sonde@example.invalid>  {}\n",
        rfc2822(mtime)
    )
}

/// `Sat, 28 Nov 2026 02:00:46 +0000`: seconds since the epoch as deb-changelog(5) dates them.
fn rfc2822(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Days to a civil date (Howard Hinnant's days_from_civil, inverted), from 1970-01-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {h:02}:{m:02}:{s:02} +0000",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize]
    )
}

/// The control file (deb-control(5)). A static binary: no `Depends`.
fn control(version: &str, installed_kib: usize) -> String {
    let mut description = String::new();
    for line in layout::description().lines() {
        let _ = writeln!(description, " {line}");
    }
    format!(
        "Package: sonde\n\
         Version: {version}-{REVISION}\n\
         Architecture: {ARCH}\n\
         Maintainer: the sonde developers <sonde@example.invalid>\n\
         Installed-Size: {installed_kib}\n\
         Section: net\n\
         Priority: optional\n\
         Homepage: {homepage}\n\
         Description: {summary}\n{description}",
        homepage = env!("CARGO_PKG_REPOSITORY"),
        summary = layout::summary(),
    )
}

/// The administrator's files: dpkg keeps their edits on upgrade and removes them on purge.
fn conffiles(entries: &[Entry]) -> String {
    entries
        .iter()
        .filter(|e| e.kind == Kind::Config)
        .map(|e| format!("{}\n", e.path))
        .collect()
}

/// What `dpkg --verify` checks: each file's MD5 and its path without the leading `/`.
fn md5sums(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let sum = Md5::digest(&e.data);
        for byte in sum {
            let _ = write!(out, "{byte:02x}");
        }
        let _ = writeln!(out, "  {}", &e.path[1..]);
    }
    out
}

/// After unpacking: the secret, made once (an upgrade keeps it), and systemd told of the unit.
/// The service is not enabled: an agent opens a port to the network, which the administrator
/// decides (`systemctl enable --now sonde`).
fn postinst() -> String {
    format!(
        "#!/bin/sh\n\
         set -e\n\
         if [ \"$1\" = configure ]; then\n\
         {MAKE_SECRET}\
         fi\n\
         if [ -d /run/systemd/system ]; then\n    \
             systemctl daemon-reload >/dev/null || true\n\
         fi\n\
         exit 0\n"
    )
}

/// Before removal (not upgrade): the service stopped, and its enablement links removed
/// (`systemctl disable` works without a running systemd too).
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop sonde.service >/dev/null 2>&1 || true
    fi
    if command -v systemctl >/dev/null; then
        systemctl disable sonde.service >/dev/null 2>&1 || true
    fi
fi
exit 0
";

/// After removal: systemd forgets the unit; a purge also removes the secret the package made
/// (dpkg removes the conffile itself), and then `/etc/sonde` if nothing else is in it.
const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
if [ \"$1\" = purge ]; then
    rm -f /etc/sonde/secret /etc/sonde/secret.new
    rmdir /etc/sonde 2>/dev/null || true
fi
exit 0
";

/// A gzipped tar of root-owned entries, every time stamp `mtime`.
pub(crate) struct Tarball {
    builder: tar::Builder<GzEncoder<Vec<u8>>>,
    mtime: u64,
}

impl Tarball {
    pub(crate) fn new(mtime: u64) -> Self {
        let gz = GzEncoder::new(Vec::new(), Compression::best());
        let mut builder = tar::Builder::new(gz);
        builder.mode(tar::HeaderMode::Deterministic);
        Self { builder, mtime }
    }

    /// A header named `path` exactly as given: the `tar` crate's `set_path` would drop the `./`
    /// that dpkg-deb writes before each name, so the name's bytes are set here (at most 99,
    /// which every path of these packages is far below).
    fn header(
        &self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        size: u64,
    ) -> Result<tar::Header> {
        let mut h = tar::Header::new_gnu();
        let name = &mut h.as_old_mut().name;
        anyhow::ensure!(path.len() < name.len(), "tar path too long: {path}");
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(self.mtime);
        h.set_uid(0);
        h.set_gid(0);
        h.set_username("root")?;
        h.set_groupname("root")?;
        h.set_cksum();
        Ok(h)
    }

    pub(crate) fn dir(&mut self, path: &str) -> Result<()> {
        let h = self.header(path, tar::EntryType::Directory, 0o755, 0)?;
        self.builder.append(&h, std::io::empty())?;
        Ok(())
    }

    pub(crate) fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let h = self.header(path, tar::EntryType::Regular, mode, data.len() as u64)?;
        self.builder.append(&h, data)?;
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<Vec<u8>> {
        let mut gz = self.builder.into_inner()?;
        gz.flush()?;
        Ok(gz.finish()?)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::layout::{entries, tests, Format};

    /// The members of the `ar` archive, in order, with their bytes.
    fn members(deb: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = ar::Archive::new(deb);
        let mut out = Vec::new();
        while let Some(entry) = archive.next_entry() {
            let mut entry = entry.unwrap();
            let name = String::from_utf8(entry.header().identifier().to_vec()).unwrap();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            out.push((name, bytes));
        }
        out
    }

    /// A tar.gz's entries: path, mode, owner, contents.
    fn unpack(tgz: &[u8]) -> Vec<(String, u32, u64, Vec<u8>)> {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tgz));
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let (mode, uid) = (e.header().mode().unwrap(), e.header().uid().unwrap());
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                (path, mode, uid, bytes)
            })
            .collect()
    }

    fn built() -> Vec<(String, Vec<u8>)> {
        let all = entries(&tests::generated(), &tests::licences(), Format::Deb);
        members(&build(&all, "0.1.0", 1_700_000_000).unwrap())
    }

    #[test]
    fn the_archive_is_what_dpkg_reads() {
        let members = built();
        let names: Vec<_> = members.iter().map(|m| m.0.as_str()).collect();
        assert_eq!(names, ["debian-binary", "control.tar.gz", "data.tar.gz"]);
        assert_eq!(members[0].1, b"2.0\n");

        let data = unpack(&members[2].1);
        let binary = data.iter().find(|f| f.0 == "./usr/bin/sonde").unwrap();
        assert_eq!((binary.1, binary.2), (0o755, 0));
        assert_eq!(binary.3, b"\x7fELF binary");
        // Each directory is listed before what it holds.
        let etc = data.iter().position(|f| f.0 == "./etc/sonde/").unwrap();
        let env = data
            .iter()
            .position(|f| f.0 == "./etc/sonde/sonde.env")
            .unwrap();
        assert!(etc < env);
    }

    #[test]
    fn changelog_dates_are_rfc_2822() {
        assert_eq!(rfc2822(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(rfc2822(1_795_831_246), "Sat, 28 Nov 2026 02:00:46 +0000");
        assert_eq!(rfc2822(951_782_400), "Tue, 29 Feb 2000 00:00:00 +0000");
        let data = unpack(&built()[2].1);
        assert!(data.iter().any(|f| f.0 == format!(".{CHANGELOG_PATH}")));
    }

    #[test]
    fn control_names_the_conffile_the_scripts_and_the_sums() {
        let control = unpack(&built()[1].1);
        let file = |name: &str| {
            let f = control.iter().find(|f| f.0 == name).unwrap();
            (f.1, String::from_utf8(f.3.clone()).unwrap())
        };
        let (_, fields) = file("./control");
        assert!(fields.starts_with("Package: sonde\nVersion: 0.1.0-1\nArchitecture: amd64\n"));
        assert!(fields
            .lines()
            .skip_while(|l| !l.starts_with("Description:"))
            .skip(1)
            .all(|l| l.starts_with(' ')));
        assert_eq!(file("./conffiles").1, "/etc/sonde/sonde.env\n");
        let (_, sums) = file("./md5sums");
        assert!(sums
            .lines()
            .any(|l| l.ends_with("  usr/bin/sonde") && l.len() == 32 + 2 + 13));
        for script in ["./postinst", "./prerm", "./postrm"] {
            let (mode, text) = file(script);
            assert_eq!(mode, 0o755, "{script}");
            assert!(text.starts_with("#!/bin/sh\nset -e\n"), "{script}");
        }
        assert!(file("./postinst").1.contains("/etc/sonde/secret"));
    }
}
