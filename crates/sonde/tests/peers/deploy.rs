//! What `deploy/` and the `Dockerfile` promise, checked without a cluster, a registry or a
//! Docker daemon:
//!
//! - the static binary the image is made of (`x86_64-unknown-linux-musl`, `--profile dist`)
//!   has no ELF interpreter and no shared library, and runs in an empty root as the image's
//!   unprivileged user (`chroot --userspec=65532:65532` into a directory holding only the
//!   binary, which is all a `FROM scratch` image has): `--version`, `sonde quick`, and `sonde
//!   server` with a secret file serving a client from outside;
//! - `deploy/check.py` accepts the Kubernetes manifests (strict schemas), the mesh file and the
//!   Grafana dashboard's PromQL (`promtool`), and rejects each kind of typo;
//! - the ConfigMap's mesh.toml passes sonde's own parser (`sonde server --mesh FILE --check`).
//!
//! Needs root (chroot), the musl target (`rustup target add x86_64-unknown-linux-musl`) and
//! Debian's `musl-tools` for the first; a Python with PyPI's `kubernetes-validate`
//! (`SONDE_PYTHON`, else `python3`) and `promtool` (Debian's `prometheus`) for the second.
//! `.ci/run` installs them all; elsewhere the tests skip with the reason.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{check_within, run_with_timeout, Daemon, Need};

/// The musl release build, cold, on a busy 2-core host.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);

const MUSL: &str = "x86_64-unknown-linux-musl";

/// The image's `USER` (Dockerfile).
const IMAGE_USER: &str = "65532:65532";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}

// ---------------------------------------------------------------------------------------------
// The static binary in an empty root
// ---------------------------------------------------------------------------------------------

/// What an ELF file needs from the system to run: its interpreter (`PT_INTERP`, the dynamic
/// loader) and the shared libraries it names (`DT_NEEDED`).
#[derive(Debug, Default)]
struct ElfNeeds {
    interpreter: Option<String>,
    needed: usize,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes(b[at..at + 2].try_into().unwrap()))
}

fn u64_at(b: &[u8], at: usize) -> usize {
    usize::try_from(u64::from_le_bytes(b[at..at + 8].try_into().unwrap())).unwrap()
}

/// Reads the program headers of a little-endian ELF64 file (elf(5)).
fn elf_needs(path: &Path) -> ElfNeeds {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NEEDED: usize = 1;
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..4], b"\x7fELF", "{} is not ELF", path.display());
    assert_eq!(
        (b[4], b[5]),
        (2, 1),
        "{}: not little-endian ELF64",
        path.display()
    );
    let (phoff, phentsize, phnum) = (u64_at(&b, 0x20), u16_at(&b, 0x36), u16_at(&b, 0x38));
    let mut needs = ElfNeeds::default();
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(b[ph..ph + 4].try_into().unwrap());
        let (offset, size) = (u64_at(&b, ph + 8), u64_at(&b, ph + 0x20));
        match p_type {
            PT_INTERP => {
                let name = &b[offset..offset + size];
                let name = name.split(|&c| c == 0).next().unwrap_or_default();
                needs.interpreter = Some(String::from_utf8_lossy(name).into_owned());
            }
            PT_DYNAMIC => {
                needs.needed += b[offset..offset + size]
                    .chunks_exact(16)
                    .filter(|entry| u64_at(entry, 0) == DT_NEEDED)
                    .count();
            }
            _ => {}
        }
    }
    needs
}

/// Builds the static binary the image is made of, as the Dockerfile's build stage does (and as
/// docs/deploy.md, "Container image", says for a host build). Cargo builds it once; later runs are a
/// no-op.
fn build_static_binary() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(repo_root())
        .args(["build", "--locked", "--profile", "dist", "--target", MUSL])
        .args(["-p", "sonde"])
        // Debian's musl-tools: the C compiler for the bundled SQLite and ring (rustls' crypto).
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc");
    check_within(&mut cmd, BUILD_TIMEOUT);
    target_dir().join(MUSL).join("dist/sonde")
}

fn musl_target_installed() -> bool {
    let out = Command::new("rustc")
        .args(["--print", "target-libdir", "--target", MUSL])
        .output();
    out.is_ok_and(|o| {
        o.status.success() && Path::new(String::from_utf8_lossy(&o.stdout).trim()).is_dir()
    })
}

/// A directory holding only `/sonde` (and what a test adds), readable by the image's user.
fn empty_root(binary: &Path) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::Builder::new()
        .prefix("sonde-scratch-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary root");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(binary, root.path().join("sonde")).expect("copy the binary");
    root
}

/// `chroot --userspec=65532:65532 ROOT /sonde ARGS...`: the image's entrypoint and user.
fn in_scratch(root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(common::tool("chroot"));
    cmd.arg(format!("--userspec={IMAGE_USER}"))
        .arg(root)
        .arg("/sonde")
        .args(args)
        .env_clear();
    cmd
}

#[test]
fn the_static_binary_runs_in_an_empty_root_as_the_image_does() {
    let _file = crate::common::file_lock(module_path!());
    let test = "the_static_binary_runs_in_an_empty_root_as_the_image_does";
    if !common::require_or_skip(
        test,
        &[Need::Root, Need::Cmd("chroot"), Need::Cmd("musl-gcc")],
    ) {
        return;
    }
    if !musl_target_installed() {
        common::skip(test, &format!("`rustup target add {MUSL}` first"));
        return;
    }
    let binary = build_static_binary();

    // Static: nothing for a loader to find in an image that has none. The check itself tells
    // a dynamic binary (this test's own build of sonde) from a static one.
    let needs = elf_needs(&binary);
    assert!(
        needs.interpreter.is_none() && needs.needed == 0,
        "{} is not static: {needs:?}",
        binary.display()
    );
    let dynamic = elf_needs(&common::sonde_bin());
    assert!(
        dynamic.interpreter.is_some() && dynamic.needed > 0,
        "the ELF check found no interpreter in the glibc build: {dynamic:?}"
    );

    let root = empty_root(&binary);
    let version = check_within(
        &mut in_scratch(root.path(), &["--version"]),
        Duration::from_secs(30),
    );
    assert_eq!(
        version.trim(),
        format!("sonde {}", env!("CARGO_PKG_VERSION")),
        "--version in the empty root"
    );

    // `quick`: an agent in-process and every test against it, with no /proc, /etc, /tmp or
    // home directory; nothing to save to (--no-save), as in a container.
    let out = check_within(
        &mut in_scratch(root.path(), &["quick", "-t", "1", "--no-save", "--json"]),
        Duration::from_secs(180),
    );
    let doc: serde_json::Value = serde_json::from_str(&out).expect("quick --json");
    let results = doc["results"].as_array().expect("results");
    assert!(!results.is_empty(), "{doc}");
    for case in results {
        let result = &case["result"];
        let counted = match result["test"].as_str() {
            Some("latency") => result["samples"].as_u64(),
            Some("throughput") => result["receiver"]["bytes"].as_u64(),
            Some("pps") => result["received"].as_u64(),
            Some("crr") => result["agent_transactions"].as_u64(),
            other => panic!("unexpected test {other:?}"),
        };
        assert!(counted.unwrap_or(0) > 0, "nothing counted: {case}");
    }

    // The image's command: `sonde server`, with the secret as a mounted file (the DaemonSet's
    // way), serving a client from outside the root.
    let secret = root.path().join("secret");
    std::fs::write(&secret, "deploy test secret\n").unwrap();
    let mut agent = Daemon::spawn(&mut in_scratch(
        root.path(),
        &[
            "server",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--secret-file",
            "/secret",
        ],
    ));
    let (addr, port) =
        agent.wait_for_line(common::AGENT_READY_TIMEOUT, common::parse_listening_line);
    let target = format!("{addr}:{port}");
    let mut client = common::sonde_command();
    client.args([
        "latency",
        &target,
        "-t",
        "1",
        "--no-save",
        "--json",
        "--secret-file",
    ]);
    client.arg(&secret);
    let out = run_with_timeout(&mut client, Duration::from_secs(60)).expect("client");
    assert!(out.status.success(), "{}\n{}", out.stderr, agent.stderr());
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).expect("latency --json");
    assert!(doc["samples"].as_u64().unwrap_or(0) > 0, "{doc}");
    // And without the secret, refused (exit code 4).
    let mut stranger = common::sonde_command();
    stranger
        .args(["latency", &target, "-t", "1", "--no-save"])
        .env_remove("SONDE_SECRET");
    let out = run_with_timeout(&mut stranger, Duration::from_secs(60)).expect("client");
    assert_eq!(out.status.code(), Some(4), "{}", out.stderr);
}

// ---------------------------------------------------------------------------------------------
// deploy/check.py: manifests, mesh file, dashboard
// ---------------------------------------------------------------------------------------------

/// The Python that has `kubernetes_validate` (`SONDE_PYTHON`, else `python3`), when there is one
/// and `promtool` too; otherwise skips (or fails in CI) with the reason.
fn checker(test: &str) -> Option<PathBuf> {
    if !common::require_or_skip(test, &[Need::Cmd("promtool")]) {
        return None;
    }
    let python = std::env::var_os("SONDE_PYTHON").map_or_else(|| "python3".into(), PathBuf::from);
    let has = Command::new(&python)
        .args([
            "-c",
            "import kubernetes_validate, jsonschema, yaml, tomllib",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        common::skip(
            test,
            &format!(
                "{} has no kubernetes_validate (pip install kubernetes-validate, or set \
                 SONDE_PYTHON to a Python that has it; .ci/run makes target/ci-venv)",
                python.display()
            ),
        );
        return None;
    }
    Some(python)
}

fn run_check(python: &Path, deploy: &Path) -> common::Output {
    let mut cmd = Command::new(python);
    cmd.arg(deploy.join("check.py")).arg(deploy);
    run_with_timeout(&mut cmd, Duration::from_secs(120)).expect("deploy/check.py")
}

#[test]
fn the_manifests_the_mesh_file_and_the_dashboard_pass_the_offline_checks() {
    let _file = crate::common::file_lock(module_path!());
    let test = "the_manifests_the_mesh_file_and_the_dashboard_pass_the_offline_checks";
    let Some(python) = checker(test) else { return };
    let out = run_check(&python, &repo_root().join("deploy"));
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    // Every kustomization was rendered, and the kinds docs/deploy.md promises are there.
    for line in [
        "kubernetes/base: 5 objects (ConfigMap, DaemonSet, Namespace, Secret, Service)",
        "kubernetes/default: 6 objects (ConfigMap, DaemonSet, Namespace, Secret, Service, ServiceMonitor)",
        "kubernetes/host-network: 6 objects",
        "kubernetes/node-labels: 13 objects (ClusterRole, ClusterRoleBinding, ConfigMap, ConfigMap, \
         DaemonSet, Deployment, Namespace, Role, RoleBinding, Secret, Service, ServiceAccount, \
         ServiceMonitor)",
        "kubernetes/node-labels-direct: 11 objects (ClusterRole, ClusterRoleBinding, ConfigMap, DaemonSet, \
         Namespace, Role, RoleBinding, Secret, Service, ServiceAccount, ServiceMonitor)",
    ] {
        assert!(out.stdout.contains(line), "{line:?} not in\n{}", out.stdout);
    }
}

/// A copy of deploy/.
fn deploy_copy() -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    let src = repo_root().join("deploy");
    let status = Command::new("cp")
        .arg("-r")
        .arg(src.join("."))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    copy
}

/// A copy of deploy/ with `from` replaced by `to` in `file` (once, and it must be there).
fn mutated(file: &str, from: &str, to: &str) -> tempfile::TempDir {
    let copy = deploy_copy();
    let path = copy.path().join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    copy
}

#[test]
fn the_offline_checks_fail_on_each_kind_of_typo() {
    let _file = crate::common::file_lock(module_path!());
    let test = "the_offline_checks_fail_on_each_kind_of_typo";
    let Some(python) = checker(test) else { return };
    let cases = [
        // A misspelt field of a built-in kind: strict schema validation.
        (
            "kubernetes/base/daemonset.yaml",
            "readOnlyRootFilesystem",
            "readOnlyRootFileSystem",
            "'readOnlyRootFileSystem' was unexpected",
        ),
        // A field in the wrong place.
        (
            "kubernetes/base/service.yaml",
            "  clusterIP: None",
            "  clusterIP: None\n  hostNetwork: true",
            "'hostNetwork' was unexpected",
        ),
        // The overlay's patch: hostNetwork must land in the pod spec.
        (
            "kubernetes/host-network/host-network.yaml",
            "/spec/template/spec/hostNetwork",
            "/spec/template/hostNetwork",
            "'hostNetwork' was unexpected",
        ),
        // The alerting rule's unit tests: an alert that waits too long does not fire in time.
        (
            "prometheus/sonde-mesh-rules.yml",
            "for: 10m",
            "for: 1h",
            "promtool test rules failed",
        ),
        // The ServiceMonitor against its schema.
        (
            "kubernetes/default/servicemonitor.yaml",
            "scrapeTimeout",
            "scrapeTimout",
            "'scrapeTimout' was unexpected",
        ),
        (
            "kubernetes/default/servicemonitor.yaml",
            "interval: 30s",
            "interval: 30 seconds",
            "does not match",
        ),
        // The mesh file's keys (docs/mesh.md).
        (
            "kubernetes/base/configmap.yaml",
            "dns_port = 5300",
            "dns_prot = 5300",
            "unknown key peers.dns_prot",
        ),
        // The agent's name is its address, as its peers' are (the dashboard's matrix).
        (
            "kubernetes/base/daemonset.yaml",
            "fieldPath: status.podIP",
            "fieldPath: metadata.name",
            "SONDE_MESH_NAME must come from status.podIP",
        ),
        (
            "kubernetes/host-network/host-network.yaml",
            "value: status.hostIP",
            "value: status.podIP",
            "SONDE_MESH_NAME must come from status.hostIP",
        ),
        // The agent's flags for a mesh: sessions for every peer's probes (the default 16 serves
        // 7 peers), and no log line per probe session.
        (
            "kubernetes/base/daemonset.yaml",
            "            - --max-sessions=256\n",
            "",
            "no --max-sessions: the default 16 lets 16 peers' scheduled tests",
        ),
        (
            "kubernetes/base/daemonset.yaml",
            "--max-sessions=256",
            "--max-sessions=16",
            "--max-sessions 16 is below 256",
        ),
        (
            "kubernetes/base/daemonset.yaml",
            "            - --quiet\n",
            "",
            "no --quiet",
        ),
        // The Secret the agents mount is the one kustomize generates from base/secret.txt,
        // and that file is never committed.
        (
            "kubernetes/base/daemonset.yaml",
            "secretName: sonde-secret",
            "secretName: sonde-secrets",
            "no pod volume names the generated Secret sonde-secret",
        ),
        (
            "kubernetes/base/.gitignore",
            "secret.txt",
            "secrets.txt",
            "secret file secret.txt is not in base/.gitignore",
        ),
        // The agents' image is set through kustomization.yaml's `images:` entry (`kustomize
        // edit set image`), which must match the DaemonSet's container.
        (
            "kubernetes/base/daemonset.yaml",
            "          image: sonde\n",
            "          image: sonde-agent\n",
            "images entry 'sonde' matches no container image",
        ),
        // The node-labels-direct overlay: the RBAC [peers] kubernetes needs, the token mounted,
        // the Service it names; and the base, on DNS, mounts no token.
        (
            "kubernetes/node-labels-direct/rbac.yaml",
            "verbs: [\"get\", \"list\", \"watch\"]",
            "verbs: [\"get\", \"list\"]",
            "ServiceAccount sonde may not watch nodes cluster-wide",
        ),
        (
            "kubernetes/node-labels-direct/rbac.yaml",
            "resources: [\"endpointslices\"]",
            "resources: [\"endpoints\"]",
            "ServiceAccount sonde may not list, watch endpointslices.discovery.k8s.io in namespace sonde",
        ),
        (
            "kubernetes/node-labels-direct/rbac.yaml",
            "    name: sonde\n    namespace: sonde\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n",
            "    name: sonde-agent\n    namespace: sonde\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n",
            "ServiceAccount sonde may not list, watch nodes cluster-wide",
        ),
        (
            "kubernetes/node-labels-direct/daemonset.yaml",
            "  value: true",
            "  value: false",
            "automountServiceAccountToken is false",
        ),
        (
            "kubernetes/node-labels-direct/mesh.yaml",
            "kubernetes = { service = \"sonde\"",
            "kubernetes = { service = \"sonde-mesh\"",
            "peers.kubernetes.service = 'sonde-mesh' is not a Service here",
        ),
        (
            "kubernetes/node-labels-direct/mesh.yaml",
            "kubernetes = { service",
            "kubernetes = { servce = \"x\", service",
            "unknown key peers.kubernetes.servce",
        ),
        // The node-labels overlay: the publisher's RBAC (by the ConfigMap's name), the
        // ConfigMap it writes mounted where the agents' [peers] file reads it, and no RBAC for
        // the agents.
        (
            "kubernetes/node-labels/publish.yaml",
            "verbs: [\"get\", \"update\"]",
            "verbs: [\"get\"]",
            "ServiceAccount sonde-publish may not update or patch configmaps sonde-peers in namespace sonde",
        ),
        (
            "kubernetes/node-labels/publish.yaml",
            "resourceNames: [\"sonde-peers\"]",
            "resourceNames: [\"sonde-peer\"]",
            "ServiceAccount sonde-publish may not get, update or patch configmaps sonde-peers",
        ),
        (
            "kubernetes/node-labels/publish.yaml",
            "    verbs: [\"list\", \"watch\"]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding",
            "    verbs: [\"list\"]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding",
            "ServiceAccount sonde-publish may not watch nodes cluster-wide",
        ),
        (
            "kubernetes/node-labels/peers.yaml",
            "name: sonde-peers",
            "name: sonde-peers-shipped",
            "ServiceAccount sonde-publish may not create configmaps sonde-peers",
        ),
        (
            "kubernetes/node-labels/daemonset.yaml",
            "mountPath: /etc/sonde/peers",
            "mountPath: /etc/sonde/peer",
            "the agents do not read what the publisher writes",
        ),
        (
            "kubernetes/node-labels/publish.yaml",
            "    name: sonde-publish\n    namespace: sonde\n---\napiVersion: apps/v1",
            "    name: default\n    namespace: sonde\n---\napiVersion: apps/v1",
            "RoleBinding sonde-publish grants the agents' ServiceAccount default API access",
        ),
        (
            "kubernetes/base/daemonset.yaml",
            "automountServiceAccountToken: false",
            "automountServiceAccountToken: true",
            "mounts a service account token but its mesh uses no API",
        ),
        // PromQL syntax (promtool).
        (
            "grafana/sonde-mesh.json",
            "(rate(sonde_rtt_seconds_bucket[5m])))",
            "(rate(sonde_rtt_seconds_bucket[5m]))",
            "promtool check rules failed",
        ),
        // A metric name the agents do not export.
        (
            "grafana/sonde-mesh.json",
            "sonde_probes_lost_total",
            "sonde_probe_lost_total",
            "metric sonde_probe_lost_total is not in docs/mesh.md",
        ),
    ];
    for (file, from, to, expect) in cases {
        let copy = mutated(file, from, to);
        let out = run_check(&python, copy.path());
        assert!(
            !out.status.success(),
            "{file}: {from:?} -> {to:?} passed the checks\n{}",
            out.stdout
        );
        assert!(
            out.stderr.contains(expect),
            "{file}: {from:?} -> {to:?}: {expect:?} not in\n{}",
            out.stderr
        );
    }
}

/// The secret file a user makes (docs/agent.md: `head -c 32 /dev/urandom | base64 >
/// deploy/kubernetes/base/secret.txt`) is what the generated Secret holds; one the agent would
/// refuse, or too short to be a secret, fails the check.
#[test]
fn the_secret_file_the_user_makes_is_checked() {
    let _file = crate::common::file_lock(module_path!());
    let test = "the_secret_file_the_user_makes_is_checked";
    let Some(python) = checker(test) else { return };
    let secret = "kubernetes/base/secret.txt";
    for (content, expect) in [
        ("\n", "the shared secret is empty"),
        ("short\n", "holds 5 bytes, fewer than 16"),
    ] {
        let copy = deploy_copy();
        std::fs::write(copy.path().join(secret), content).unwrap();
        let out = run_check(&python, copy.path());
        assert!(!out.status.success(), "{content:?} passed\n{}", out.stdout);
        assert!(
            out.stderr.contains(expect),
            "{expect:?} not in\n{}",
            out.stderr
        );
    }
    let copy = deploy_copy();
    std::fs::write(
        copy.path().join(secret),
        "x/7PoFf1vlLyqpVdtw47jP3f7cigvEOX48I+duT3CYw=\n",
    )
    .unwrap();
    let out = run_check(&python, copy.path());
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    // The file, not the placeholder a fresh clone is checked with, was rendered.
    assert!(!out.stdout.contains("placeholder"), "{}", out.stdout);
    let _ = std::fs::remove_file(copy.path().join(secret));
    let out = run_check(&python, copy.path());
    assert!(out.status.success(), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("secret.txt is absent"),
        "{}",
        out.stdout
    );
}

// ---------------------------------------------------------------------------------------------
// The shipped mesh file, read by sonde's own parser
// ---------------------------------------------------------------------------------------------

/// The ConfigMap's `mesh.toml`: the block scalar (`mesh.toml: |`) under `data:`, unindented.
fn configmap_mesh_toml(yaml: &str) -> String {
    block_scalar(yaml, "mesh.toml: |")
}

/// The block scalar that follows the line `key` (e.g. `value: |`), unindented.
fn block_scalar(yaml: &str, key: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != key);
    let key = lines
        .next()
        .unwrap_or_else(|| panic!("no {key:?} in\n{yaml}"));
    let key_indent = key.len() - key.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .expect("mesh.toml is empty");
    body.iter()
        .map(|l| l.get(indent..).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `sonde server --mesh FILE --check` on `toml`.
fn check_mesh(toml: &str) -> common::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.toml");
    std::fs::write(&path, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sonde"));
    cmd.arg("server")
        .arg("--mesh")
        .arg(&path)
        .arg("--check")
        .env_remove("SONDE_MESH_NAME");
    run_with_timeout(&mut cmd, Duration::from_secs(60)).expect("sonde server --check")
}

#[test]
fn the_configmaps_mesh_file_passes_sondes_own_check() {
    let _file = crate::common::file_lock(module_path!());
    let yaml =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/base/configmap.yaml")).unwrap();
    let toml = configmap_mesh_toml(&yaml);
    let out = check_mesh(&toml);
    assert!(out.status.success(), "{}{}\n{toml}", out.stdout, out.stderr);
    // What the manifests rely on: the agents find each other through the headless Service on
    // the DaemonSet's port, and the scheduled test is the subcommand's.
    for want in [
        "dns: every address of sonde.sonde.svc, port 5300",
        "over udp and tcp",
        "sonde throughput PEER",
    ] {
        assert!(out.stdout.contains(want), "{want:?} not in\n{}", out.stdout);
    }
    // The extraction and the check are not vacuous: a misspelt key in the same file fails,
    // naming it, with the usage exit code.
    let typo = toml.replacen("[throughput]\n", "[throughput]\nparalel = 2\n", 1);
    assert_ne!(typo, toml, "the ConfigMap's mesh.toml has no [throughput]");
    let out = check_mesh(&typo);
    assert_eq!(out.status.code(), Some(2), "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("\"paralel\""), "{}", out.stderr);
}

/// The node-labels-direct overlay's mesh file (the ConfigMap patch's `value: |`): `[peers] kubernetes`
/// with zone and rack from the node labels, and a `[select]` over them, as `--check` reads it
/// outside a cluster (the source described, the list refused with the reason).
#[test]
fn the_node_labels_overlays_mesh_file_passes_sondes_own_check() {
    let _file = crate::common::file_lock(module_path!());
    let yaml =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/node-labels-direct/mesh.yaml"))
            .unwrap();
    let toml = block_scalar(&yaml, "value: |");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sonde"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.toml");
    std::fs::write(&path, &toml).unwrap();
    cmd.arg("server")
        .arg("--mesh")
        .arg(&path)
        .arg("--check")
        .env_remove("SONDE_MESH_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60)).expect("sonde server --check");
    assert!(out.status.success(), "{}{}\n{toml}", out.stdout, out.stderr);
    for want in [
        "kubernetes: the ready endpoints of Service sonde in this pod's namespace",
        "labels from each endpoint's node: rack=example.com/rack zone=topology.kubernetes.io/zone",
        "select: every peer with this agent's rack; 3 ring neighbours within its zone; 1 representatives between every two zone values",
        "kubernetes now: cannot list: not in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set",
    ] {
        assert!(out.stdout.contains(want), "{want:?} not in\n{}", out.stdout);
    }
}

/// The node-labels overlay's mesh file: `[peers] file` on the ConfigMap the publisher writes, at
/// the path the DaemonSet mounts it, with a `[select]` by rack and zone. Given a list as the
/// publisher writes it (`ADDRESS:PORT zone=.. rack=..`, sorted), `--check` finds this agent's
/// own entry by its name (its pod IP) and selects from the labels.
#[test]
fn the_node_labels_overlays_mesh_file_reads_the_publishers_list() {
    let _file = crate::common::file_lock(module_path!());
    let yaml = std::fs::read_to_string(repo_root().join("deploy/kubernetes/node-labels/mesh.yaml"))
        .unwrap();
    let toml = block_scalar(&yaml, "value: |");
    let mounted = "file = \"/etc/sonde/peers/peers.txt\"";
    assert!(toml.contains(mounted), "{toml}");
    let dir = tempfile::tempdir().unwrap();
    let peers = dir.path().join("peers.txt");
    std::fs::write(
        &peers,
        "10.244.1.7:5300 rack=r1 zone=z1\n\
         10.244.2.9:5300 rack=r1 zone=z1\n\
         10.244.3.4:5300 rack=r2 zone=z2\n",
    )
    .unwrap();
    let path = dir.path().join("mesh.toml");
    std::fs::write(
        &path,
        toml.replace(
            mounted,
            &format!("file = {:?}", peers.display().to_string()),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sonde"));
    cmd.arg("server")
        .arg("--mesh")
        .arg(&path)
        .arg("--check")
        .env("SONDE_MESH_NAME", "10.244.1.7");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60)).expect("sonde server --check");
    assert!(out.status.success(), "{}{}\n{toml}", out.stdout, out.stderr);
    for want in [
        "select: every peer with this agent's rack; 3 ring neighbours within its zone",
        // Its rack's peer, and across zones one representative each way.
        "peer list now: 2 peers, of which [select] probes 2; 2 agents probe this one",
    ] {
        assert!(out.stdout.contains(want), "{want:?} not in\n{}", out.stdout);
    }
}
