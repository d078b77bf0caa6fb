//! Network namespaces for the lab tests: one guard that creates them, deletes them on drop (also
//! when a test panics) and sweeps those a killed run left behind, and the link helpers the labs
//! share.
//!
//! Every namespace a sonde test creates is named `sonde-lab-<pid>-<tag><n>-<role>`, whichever
//! file creates it, so the sweep in any test binary cleans every file's leftovers: a namespace
//! whose pid is gone belonged to a run that was killed before its guards dropped. Namespaces of a
//! live process (this one, or another test binary running at the same time) are left alone.
//!
//! Namespace names are not limited to an interface name's 15 characters; the interfaces inside
//! them (`veth-a`, `veth-rb`, ...) are, and since each lives only in its own namespace, every lab
//! can use the same short names without clashing.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{check, quiet, run_with_timeout, tool};

/// The prefix of every namespace a sonde test creates.
pub(crate) const PREFIX: &str = "sonde-lab-";

/// Namespaces named `sonde-lab-<pid>-<tag><n>-<role>`, one per role, each with its loopback up.
/// Stale namespaces of dead processes are swept first and a leftover of the same name is
/// deleted; all are deleted on drop, also when a test panics, which removes the veths, qdiscs and
/// nftables rules in them.
pub(crate) struct Namespaces(Vec<String>);

impl Namespaces {
    /// Creates one namespace per role. `tag` tells one lab's namespaces from another's in
    /// listings (it may be empty); `<n>` counts the guards of this process, so names never repeat.
    pub(crate) fn new(tag: &str, roles: &[&str]) -> Namespaces {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        sweep_stale();
        let base = format!(
            "{PREFIX}{}-{tag}{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Namespaces(roles.iter().map(|r| format!("{base}-{r}")).collect());
        for name in &ns.0 {
            // A namespace of the same name can only be a leftover of a run whose pid was reused.
            let _ = quiet(Command::new(tool("ip")).args(["netns", "delete", name]));
        }
        // From here on `ns` owns whatever exists, so a failure below still cleans up.
        for name in &ns.0 {
            check(Command::new(tool("ip")).args(["netns", "add", name]));
            // Agents in some labs bind 127.0.0.1, and nothing is lost by having it everywhere.
            ip(name, &["link", "set", "dev", "lo", "up"]);
        }
        ns
    }

    /// The namespace of the `i`th role given to [`Namespaces::new`].
    pub(crate) fn name(&self, i: usize) -> &str {
        &self.0[i]
    }

    /// All of them, in the order of the roles.
    pub(crate) fn names(&self) -> &[String] {
        &self.0
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            // Fails harmlessly for one that was never created.
            let _ = quiet(Command::new(tool("ip")).args(["netns", "delete", ns]));
        }
        let left: Vec<String> = list().into_iter().filter(|n| self.0.contains(n)).collect();
        if !left.is_empty() {
            eprintln!("netns: could not delete namespaces {left:?}");
        }
    }
}

/// Names from `ip netns list` ("name" or "name (id: N)"); empty when it fails (never panics: it
/// runs in `Drop`).
pub(crate) fn list() -> Vec<String> {
    let out = run_with_timeout(
        Command::new(tool("ip")).args(["netns", "list"]),
        Duration::from_secs(10),
    )
    .map(|out| out.stdout)
    .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Deletes `sonde-lab-<pid>-...` namespaces whose test process is gone (killed before its drops
/// ran). Namespaces of a live process, this one or a concurrent run, are left alone.
pub(crate) fn sweep_stale() {
    for name in list() {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("netns: deleting stale namespace {name}");
            let _ = quiet(Command::new(tool("ip")).args(["netns", "delete", &name]));
        }
    }
}

/// `ip -n NS ARGS...`, which must succeed; its stdout.
pub(crate) fn ip(ns: &str, args: &[&str]) -> String {
    check(Command::new(tool("ip")).args(["-n", ns]).args(args))
}

/// Joins `dev_a` in namespace `ns_a` and `dev_b` in `ns_b` with a veth pair. Each end is created
/// in its namespace, never in the test's own, so labs running at once cannot clash on the names.
pub(crate) fn veth(ns_a: &str, dev_a: &str, ns_b: &str, dev_b: &str) {
    check(Command::new(tool("ip")).args([
        "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b,
    ]));
}

/// How a veth hands segmentation offload packets to its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segments {
    /// The kernel's default: a GSO super-packet (up to 64 UDP datagrams or TCP segments)
    /// crosses whole.
    Whole,
    /// `gso_max_segs 1`: one datagram or segment per packet, as a wire would carry them.
    OnePerPacket,
}

/// Brings `dev` in `ns` up at `addr`/24 with `mtu` and no IPv6 link-local address, so nothing
/// but the tests' own packets crosses the link.
pub(crate) fn link_up(ns: &str, dev: &str, addr: &str, mtu: u32, segments: Segments) {
    ip(ns, &["link", "set", "dev", dev, "addrgenmode", "none"]);
    ip(ns, &["link", "set", "dev", dev, "mtu", &mtu.to_string()]);
    if segments == Segments::OnePerPacket {
        // A veth hands a GSO super-packet to its peer whole, where tbf and nftables see one
        // packet with one length; with one segment per packet the kernel segments before the
        // link, so they see, and count, each datagram and segment.
        ip(ns, &["link", "set", "dev", dev, "gso_max_segs", "1"]);
    }
    ip(ns, &["addr", "add", &format!("{addr}/24"), "dev", dev]);
    ip(ns, &["link", "set", "dev", dev, "up"]);
}

/// Shapes `dev`'s egress in `ns` with a token bucket: `rate` in tc's units (`100mbit` is 10^6
/// bit/s), a bucket of `burst_bytes`, and a queue that holds at most `latency` (`20ms`).
pub(crate) fn tbf(ns: &str, dev: &str, rate: &str, burst_bytes: u32, latency: &str) {
    check(Command::new(tool("tc")).args([
        "-n",
        ns,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        &burst_bytes.to_string(),
        "latency",
        latency,
    ]));
}
