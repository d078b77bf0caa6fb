//! `cargo xtask dist`: the static release build, what it generates of itself, and the three
//! packages written to `target/dist/`.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::layout::{self, Format, Generated, Licences};
use crate::{deb, rpm_package, tarball};

pub(crate) fn run() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the xtask crate is not inside the workspace")?
        .to_path_buf();
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let binary = build(&root, &target_dir)?;
    let work = target_dir.join("dist-work");
    let generated = generate(&binary, &work)?;
    let licences = Licences {
        mit: read(&root.join("LICENSE-MIT"))?,
        apache: read(&root.join("LICENSE-APACHE"))?,
    };
    let version = env!("CARGO_PKG_VERSION");
    let mtime = source_date(&root);

    // target/dist/ is also where Cargo keeps the dist profile's build scripts and proc macros
    // when building for a --target (build/, deps/, ...): only the packages of an earlier run
    // are removed, so the next build stays a no-op.
    let out = target_dir.join("dist");
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    for entry in fs::read_dir(&out)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let package = [".deb", ".rpm", ".tar.gz"]
            .iter()
            .any(|ext| name.ends_with(ext));
        if name.starts_with("sonde") && package && path.is_file() {
            fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    let packages = [
        (deb::file_name(version), Format::Deb),
        (rpm_package::file_name(version), Format::Rpm),
        (
            format!("{}.tar.gz", tarball::stem(version)),
            Format::Tarball,
        ),
    ];
    eprintln!(
        "binary: {} ({})",
        binary.display(),
        size(generated.binary.len() as u64)
    );
    for (name, format) in packages {
        let entries = layout::entries(&generated, &licences, format);
        let bytes = match format {
            Format::Deb => deb::build(&entries, version, mtime)?,
            Format::Rpm => rpm_package::build(&entries, version, mtime)?,
            Format::Tarball => tarball::build(&entries, version, mtime)?,
        };
        let path = out.join(&name);
        fs::write(&path, &bytes).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{} ({})", path.display(), size(bytes.len() as u64));
    }
    Ok(())
}

/// `cargo build --locked --profile dist --target x86_64-unknown-linux-musl -p sonde`; the
/// binary's path. musl-gcc (Debian's musl-tools) compiles the bundled SQLite and ring's C.
fn build(root: &Path, target_dir: &Path) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root).args([
        "build",
        "--locked",
        "--profile",
        "dist",
        "--target",
        tarball::TARGET,
        "-p",
        "sonde",
    ]);
    let cc = "CC_x86_64_unknown_linux_musl";
    if std::env::var_os(cc).is_none() {
        command.env(cc, "musl-gcc");
    }
    eprintln!("running {command:?}");
    let status = command.status().context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "the musl build failed ({status}); it needs `rustup target add {}` and musl-gcc \
             (Debian's musl-tools)",
            tarball::TARGET
        );
    }
    Ok(target_dir.join(tarball::TARGET).join("dist").join("sonde"))
}

/// The binary, and its man pages and completions as it writes them (`sonde man --dir`,
/// `sonde completions SHELL`): the packages hold what this very build generates.
fn generate(binary: &Path, work: &Path) -> Result<Generated> {
    let man_dir = work.join("man");
    if man_dir.exists() {
        fs::remove_dir_all(&man_dir)?;
    }
    output_of(
        binary,
        &[OsStr::new("man"), OsStr::new("--dir"), man_dir.as_os_str()],
    )?;
    let mut man_pages = Vec::new();
    for entry in fs::read_dir(&man_dir)? {
        let path = entry?.path();
        let name = path.file_name().context("a man page without a name")?;
        man_pages.push((name.to_string_lossy().into_owned(), fs::read(&path)?));
    }
    if !man_pages.iter().any(|(name, _)| name == "sonde-server.1") {
        bail!("`sonde man --dir` wrote no sonde-server.1 (the unit's Documentation= names it)");
    }
    let completion =
        |shell: &str| output_of(binary, &[OsStr::new("completions"), OsStr::new(shell)]);
    Ok(Generated {
        binary: fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?,
        man_pages,
        bash: completion("bash")?,
        zsh: completion("zsh")?,
        fish: completion("fish")?,
    })
}

/// Runs `binary` with `args`; its standard output.
fn output_of(binary: &Path, args: &[&OsStr]) -> Result<Vec<u8>> {
    let output = Command::new(binary)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    if !output.status.success() {
        bail!(
            "`sonde {}` failed ({}): {}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output.stdout)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The packages' time stamp: `SOURCE_DATE_EPOCH` if set (reproducible-builds.org), else the
/// last commit's time, so that two builds of one commit give the same archives; the current
/// time outside a git checkout.
fn source_date(root: &Path) -> u64 {
    if let Some(t) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return t;
    }
    Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%ct"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
}

/// Bytes as MB (10^6), one decimal, as docs/platforms.md states sizes.
fn size(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    format!("{mb:.1} MB, {bytes} bytes")
}
