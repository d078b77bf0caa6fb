//! The release tarball: the packages' files under one top directory,
//! `sonde-0.1.0-x86_64-unknown-linux-musl/usr/bin/sonde` and so on, so that
//! `tar -xzf ... -C / --strip-components=1` installs them where the packages do. Files only, no
//! directory entries: extracting over `/` then creates the directories that are missing and
//! leaves the modes and times of those that exist (`/usr`, `/etc`) alone.

use anyhow::Result;

use crate::deb::Tarball;
use crate::layout::Entry;

/// The build's target triple, which names the tarball and its top directory.
pub(crate) const TARGET: &str = "x86_64-unknown-linux-musl";

/// `sonde-0.1.0-x86_64-unknown-linux-musl`: the top directory; with `.tar.gz`, the file.
pub(crate) fn stem(version: &str) -> String {
    format!("sonde-{version}-{TARGET}")
}

/// The `.tar.gz` of `entries`, as bytes.
pub(crate) fn build(entries: &[Entry], version: &str, mtime: u64) -> Result<Vec<u8>> {
    let top = stem(version);
    let mut tarball = Tarball::new(mtime);
    for e in entries {
        tarball.file(&format!("{top}{}", e.path), e.mode, &e.data)?;
    }
    tarball.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{entries, tests, Format};

    #[test]
    fn files_only_under_one_top_directory() {
        let all = entries(&tests::generated(), &tests::licences(), Format::Tarball);
        let bytes = build(&all, "0.1.0", 1_700_000_000).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let listed: Vec<_> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                assert_eq!(e.header().entry_type(), tar::EntryType::Regular);
                e.path().unwrap().to_string_lossy().into_owned()
            })
            .collect();
        let expected: Vec<_> = all
            .iter()
            .map(|e| format!("sonde-0.1.0-x86_64-unknown-linux-musl{}", e.path))
            .collect();
        assert_eq!(listed, expected);
    }
}
