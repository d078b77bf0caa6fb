//! The `.rpm`, by rpm-rs (the `rpm` crate, the library cargo-generate-rpm is built on): an RPM
//! v4 package, gzip payload, unsigned.

use anyhow::Result;
use rpm::{BuildConfig, CompressionType, FileOptions, PackageBuilder, Scriptlet};

use crate::layout::{self, Entry, Kind, MAKE_SECRET};

const ARCH: &str = "x86_64";
const RELEASE: &str = "1";

/// `sonde-0.1.0-1.x86_64.rpm`, as rpmbuild names it.
pub(crate) fn file_name(version: &str) -> String {
    format!("sonde-{version}-{RELEASE}.{ARCH}.rpm")
}

/// The `.rpm` of `entries`, as bytes.
pub(crate) fn build(entries: &[Entry], version: &str, mtime: u64) -> Result<Vec<u8>> {
    let mut builder = PackageBuilder::new(
        "sonde",
        version,
        env!("CARGO_PKG_LICENSE"),
        ARCH,
        layout::summary(),
    );
    builder
        .using_config(
            BuildConfig::v4()
                .compression(CompressionType::Gzip)
                .source_date(u32::try_from(mtime)?),
        )
        .release(RELEASE)
        .url(env!("CARGO_PKG_REPOSITORY"))
        .description(layout::description());
    for e in entries {
        let options = FileOptions::new(&e.path)
            .permissions(u16::try_from(e.mode)?)
            .user("root")
            .group("root");
        let options = match e.kind {
            Kind::Plain => options,
            Kind::Config => options.config().noreplace(),
            Kind::Licence => options.license(),
        };
        builder.with_file_contents(e.data.clone(), options)?;
    }
    // The directories only this package uses are its own, so that removing it removes them.
    for dir in ["/etc/sonde", "/usr/share/doc/sonde"] {
        builder.with_dir_entry(
            FileOptions::dir(dir)
                .permissions(0o755)
                .user("root")
                .group("root"),
        )?;
    }
    builder
        .post_install_script(Scriptlet::new(post()))
        .pre_uninstall_script(Scriptlet::new(PREUN))
        .post_uninstall_script(Scriptlet::new(POSTUN));
    let mut bytes = Vec::new();
    builder.build()?.write(&mut bytes)?;
    Ok(bytes)
}

/// %post (`$1`: 1 on install, 2 on upgrade): the secret, made once, and systemd told of the
/// unit. Not enabled: the administrator decides to open the port (`systemctl enable --now sonde`).
fn post() -> String {
    format!(
        "{MAKE_SECRET}\
         if [ -d /run/systemd/system ]; then\n    \
             systemctl daemon-reload >/dev/null 2>&1 || :\n\
         fi\n"
    )
}

/// %preun (`$1`: 0 on erase, 1 on upgrade): on erase, the service stopped and disabled.
const PREUN: &str = "if [ \"$1\" -eq 0 ] && command -v systemctl >/dev/null; then
    systemctl disable --now sonde.service >/dev/null 2>&1 || :
fi
";

/// %postun: systemd forgets the unit. The secret stays (rpm has no purge): reinstalling keeps
/// the clients' secret valid; delete /etc/sonde by hand to be rid of it.
const POSTUN: &str = "if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{entries, tests, Format};

    #[test]
    fn the_package_lists_every_file_with_its_flags() {
        let all = entries(&tests::generated(), &tests::licences(), Format::Rpm);
        let bytes = build(&all, "0.1.0", 1_700_000_000).unwrap();
        let package = rpm::Package::parse(&mut &bytes[..]).unwrap();
        let meta = &package.metadata;
        assert_eq!(meta.get_name().unwrap(), "sonde");
        assert_eq!(meta.get_version().unwrap(), "0.1.0");
        assert_eq!(meta.get_release().unwrap(), "1");
        assert_eq!(meta.get_arch().unwrap(), "x86_64");
        let files = meta.get_file_entries().unwrap();
        for e in &all {
            let found = files
                .iter()
                .find(|f| f.path().to_str() == Some(e.path.as_str()))
                .unwrap_or_else(|| panic!("{} missing", e.path));
            assert_eq!(u32::from(found.permissions()), e.mode, "{}", e.path);
            assert_eq!(found.size(), e.data.len(), "{}", e.path);
            assert_eq!(
                found
                    .flags()
                    .contains(rpm::FileFlags::CONFIG | rpm::FileFlags::NOREPLACE),
                e.kind == Kind::Config,
                "{}",
                e.path
            );
        }
        assert!(files
            .iter()
            .any(|f| f.path().to_str() == Some("/etc/sonde")));
        let post = meta.get_post_install_script().unwrap();
        assert!(post.script.contains("/etc/sonde/secret"));
    }
}
