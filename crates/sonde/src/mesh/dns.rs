//! `[peers] dns`: every address of a name, looked up over TCP, so a headless Service of any size
//! gives all its peers.
//!
//! `getaddrinfo` in the static (musl) build returns at most 48 addresses per name; an answer over
//! UDP is cut at its size anyway (512 bytes, or the EDNS size: 300 A records are some 5 KB). So
//! the mesh asks the nameservers of `/etc/resolv.conf` itself, **always over TCP** (RFC 7766):
//! one code path whatever the answer's size, no truncated-then-retried lookups, and one TCP
//! connection per record type per refresh per agent is nothing to a cluster DNS. A and AAAA
//! are asked separately; the search list and `ndots` apply as the C library applies them
//! (a name with at least `ndots` dots, or ending in a dot, is tried as given first); each query
//! has resolv.conf's `timeout` (default 5 s) for the whole exchange, and the nameservers are
//! tried in order. The answer's only limit is the DNS message's 64 KiB: some 4,000 IPv4 or
//! 2,300 IPv6 addresses per name.
//!
//! A name in /etc/hosts (the C library looks there first), a system without a resolv.conf
//! nameserver (Windows), and a lookup that every nameserver failed over TCP go to
//! `getaddrinfo` instead, the last with a line saying so.
//!
//! The messages are `hickory-proto`'s (encoding and decoding, name compression, every record
//! type); the transport is std's `TcpStream` with a deadline on every read and write.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// The DNS port.
const DNS_PORT: u16 = 53;
/// The resolver configuration the mesh reads.
const RESOLV_CONF: &str = "/etc/resolv.conf";
/// Names the C library finds before DNS.
const HOSTS: &str = "/etc/hosts";

/// What a lookup needs from resolv.conf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolverConfig {
    /// Tried in order.
    pub(crate) nameservers: Vec<SocketAddr>,
    /// Domains appended to a name with fewer than `ndots` dots (tried before the name itself),
    /// or after the name itself otherwise.
    pub(crate) search: Vec<String>,
    pub(crate) ndots: usize,
    /// For one query: connect, send, and read the whole answer.
    pub(crate) timeout: Duration,
}

impl ResolverConfig {
    /// From the text of a resolv.conf.
    pub(crate) fn parse(text: &str) -> io::Result<ResolverConfig> {
        let c = resolv_conf::Config::parse(text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("resolv.conf: {e}")))?;
        Ok(ResolverConfig {
            nameservers: c
                .nameservers
                .iter()
                .map(|ip| SocketAddr::new(IpAddr::from(ip), DNS_PORT))
                .collect(),
            search: c.get_last_search_or_domain().cloned().collect(),
            ndots: c.ndots as usize,
            timeout: Duration::from_secs(u64::from(c.timeout.clamp(1, 30))),
        })
    }

    /// The names to ask for, in order.
    fn candidates(&self, name: &str) -> Vec<String> {
        if let Some(absolute) = name.strip_suffix('.') {
            return vec![absolute.to_owned()];
        }
        let suffixed = self.search.iter().map(|d| format!("{name}.{d}"));
        if name.matches('.').count() >= self.ndots {
            std::iter::once(name.to_owned()).chain(suffixed).collect()
        } else {
            suffixed.chain(std::iter::once(name.to_owned())).collect()
        }
    }
}

/// The mesh's resolver: every A and AAAA address of `name` over TCP from the system's
/// nameservers, at `port`. A name in /etc/hosts, a system without a resolv.conf nameserver, and
/// a lookup whose every nameserver failed go to `getaddrinfo` (the last saying so).
pub(crate) fn tcp_resolver(name: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let config = std::fs::read_to_string(RESOLV_CONF)
        .ok()
        .and_then(|text| ResolverConfig::parse(&text).ok())
        .filter(|c| !c.nameservers.is_empty());
    let in_hosts = std::fs::read_to_string(HOSTS).is_ok_and(|t| hosts_names(&t, name));
    let Some(config) = config.filter(|_| !in_hosts) else {
        return super::system_resolver(name, port);
    };
    match lookup(&config, name, port) {
        Ok(addrs) => Ok(addrs),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(e),
        Err(e) => {
            super::log(format_args!(
                "DNS over TCP for {name} failed ({e}); asking getaddrinfo (the static build's \
                 gives at most 48 addresses)"
            ));
            super::system_resolver(name, port)
        }
    }
}

/// Whether the hosts file `text` names `name` (the C library looks there before DNS).
fn hosts_names(text: &str, name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    text.lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(|l| l.split_whitespace().skip(1))
        .any(|n| n.eq_ignore_ascii_case(name))
}

/// Every A and AAAA address of `name` (through the search list) at `port`, over TCP. An error
/// of kind `NotFound` when no candidate name has an address; another when no nameserver
/// answered.
pub(crate) fn lookup(
    config: &ResolverConfig,
    name: &str,
    port: u16,
) -> io::Result<Vec<SocketAddr>> {
    if config.nameservers.is_empty() {
        return Err(io::Error::other("no nameserver"));
    }
    // A name the nameservers refused or failed (SERVFAIL): the next candidate is asked, as for
    // one that does not exist, but if none has an address the lookup failed, not "no record".
    let mut refused = None;
    for candidate in config.candidates(name) {
        let Ok(qname) = Name::from_ascii(&candidate).map(|mut n| {
            n.set_fqdn(true);
            n
        }) else {
            continue;
        };
        let mut addrs = Vec::new();
        for rtype in [RecordType::A, RecordType::AAAA] {
            match ask(config, &qname, rtype)? {
                Answer::Addresses(found) => {
                    addrs.extend(found.into_iter().map(|ip| SocketAddr::new(ip, port)));
                }
                // No record of any type: the next candidate.
                Answer::NoSuchName => break,
                Answer::Failed(code) => {
                    refused = Some(format!("{candidate}: the nameservers answered {code}"));
                    break;
                }
            }
        }
        if !addrs.is_empty() {
            addrs.sort_unstable();
            addrs.dedup();
            return Ok(addrs);
        }
    }
    Err(match refused {
        Some(why) => io::Error::other(why),
        None => io::Error::new(
            io::ErrorKind::NotFound,
            format!("{name}: no A or AAAA record"),
        ),
    })
}

/// A nameserver's answer to one question.
enum Answer {
    /// The addresses of the type asked (none: the name has no such record).
    Addresses(Vec<IpAddr>),
    /// NXDOMAIN: no such name.
    NoSuchName,
    /// REFUSED, SERVFAIL or another error code.
    Failed(ResponseCode),
}

/// One question to the nameservers in order: the first that answers it with addresses or
/// NXDOMAIN; else the last error code one answered; else the last transport error.
fn ask(config: &ResolverConfig, name: &Name, rtype: RecordType) -> io::Result<Answer> {
    let mut failed = None;
    let mut last = None;
    for server in &config.nameservers {
        match exchange(*server, name, rtype, config.timeout) {
            Ok(Answer::Failed(code)) => failed = Some(code),
            Ok(answer) => return Ok(answer),
            Err(e) => last = Some(io::Error::new(e.kind(), format!("{server}: {e}"))),
        }
    }
    match (failed, last) {
        (Some(code), _) => Ok(Answer::Failed(code)),
        (None, Some(e)) => Err(e),
        (None, None) => Err(io::Error::other("no nameserver")),
    }
}

fn exchange(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
    timeout: Duration,
) -> io::Result<Answer> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))
    };
    let id = query_id();
    let mut query = Message::new();
    query
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), rtype));
    let bytes = query.to_vec().map_err(io::Error::other)?;
    let len = u16::try_from(bytes.len()).map_err(io::Error::other)?;
    let mut stream = TcpStream::connect_timeout(&server, left()?)?;
    stream.set_write_timeout(Some(left()?))?;
    // One write: the two-byte length (RFC 1035 4.2.2) and the message.
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&bytes);
    stream.write_all(&framed)?;
    let mut read_exact = |buf: &mut [u8]| -> io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            stream.set_read_timeout(Some(left()?))?;
            match stream.read(&mut buf[at..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let mut len = [0u8; 2];
    read_exact(&mut len)?;
    // At most 64 KiB, as the length field says: nothing larger can be asked for.
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
    read_exact(&mut answer)?;
    let reply = Message::from_vec(&answer)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    if reply.id() != id || reply.message_type() != MessageType::Response {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "an answer to another question",
        ));
    }
    match reply.response_code() {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => return Ok(Answer::NoSuchName),
        code => return Ok(Answer::Failed(code)),
    }
    // The records of the type asked (a CNAME chain's target records come with it).
    Ok(Answer::Addresses(
        reply
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) if rtype == RecordType::A => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) if rtype == RecordType::AAAA => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect(),
    ))
}

/// A query id nobody on the path predicts (std's per-process random hash keys).
fn query_id() -> u16 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() & 0xffff) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::net::{Ipv4Addr, TcpListener, UdpSocket};
    use std::process::{Child, Command, Stdio};

    #[test]
    fn resolv_conf_gives_nameservers_search_list_ndots_and_timeout() {
        let c = ResolverConfig::parse(
            "nameserver 10.96.0.10\nnameserver ::1\nsearch sonde.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:2\n",
        )
        .unwrap();
        assert_eq!(
            c.nameservers,
            [
                "10.96.0.10:53".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert_eq!((c.ndots, c.timeout), (5, Duration::from_secs(2)));
        // Kubernetes' ndots:5: a Service's full name (4 dots) goes through the search list
        // first, then as given.
        let names = c.candidates("sonde.sonde.svc.cluster.local");
        assert_eq!(names.len(), 4);
        assert_eq!(
            names[0],
            "sonde.sonde.svc.cluster.local.sonde.svc.cluster.local"
        );
        assert_eq!(names[3], "sonde.sonde.svc.cluster.local");
        // A trailing dot: only as given.
        assert_eq!(c.candidates("sonde.example."), ["sonde.example"]);
        // Defaults: ndots 1, 5 s.
        let d = ResolverConfig::parse("nameserver 192.0.2.1\nsearch example.org\n").unwrap();
        assert_eq!((d.ndots, d.timeout), (1, Duration::from_secs(5)));
        assert_eq!(d.candidates("a.b"), ["a.b", "a.b.example.org"]);
        assert_eq!(d.candidates("peers"), ["peers.example.org", "peers"]);
    }

    #[test]
    fn names_in_the_hosts_file_are_found() {
        let hosts =
            "127.0.0.1 localhost\n# 10.0.0.9 commented\n10.0.0.1 node-a node-a.lab  # two\n";
        assert!(hosts_names(hosts, "localhost"));
        assert!(hosts_names(hosts, "node-a.lab."));
        assert!(hosts_names(hosts, "NODE-A"));
        assert!(!hosts_names(hosts, "commented"));
        assert!(!hosts_names(hosts, "127.0.0.1"));
    }

    /// A `dnsmasq` serving a hosts file on 127.0.0.1:`port`, killed on drop.
    struct Dnsmasq(Child);

    impl Drop for Dnsmasq {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn find(cmd: &str) -> Option<std::path::PathBuf> {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .map(|d| d.join(cmd))
            .find(|p| p.is_file())
    }

    /// A port free for both TCP and UDP on 127.0.0.1 now.
    fn free_port() -> u16 {
        loop {
            let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = tcp.local_addr().unwrap().port();
            if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }

    /// 300 A records for one name (and 2 AAAA), served by a real dnsmasq: the mesh's lookup gets
    /// every one, through the search list, where the static build's getaddrinfo would stop at 48.
    #[test]
    fn dns_over_tcp_gets_all_300_addresses_from_dnsmasq() {
        let Some(dnsmasq) = find("dnsmasq") else {
            assert!(
                std::env::var_os("SONDE_TEST_REQUIRE_ALL").is_none_or(|v| v != "1"),
                "dnsmasq not found (SONDE_TEST_REQUIRE_ALL=1)"
            );
            eprintln!("SKIP dns_over_tcp_gets_all_300_addresses_from_dnsmasq: dnsmasq not found");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        let mut text = String::new();
        let mut want = BTreeSet::new();
        for i in 0..300u32 {
            let ip = Ipv4Addr::new(198, 18, (i / 250) as u8, (i % 250 + 1) as u8);
            text.push_str(&format!("{ip} sonde.mesh.test\n"));
            want.insert(SocketAddr::new(IpAddr::V4(ip), 5300));
        }
        for ip in ["2001:db8::1", "2001:db8::2"] {
            text.push_str(&format!("{ip} sonde.mesh.test\n"));
            want.insert(SocketAddr::new(ip.parse().unwrap(), 5300));
        }
        std::fs::write(&hosts, text).unwrap();
        // A few tries: the port is free when picked, but another process may take it first.
        let mut started = None;
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(&dnsmasq)
                .args([
                    "--keep-in-foreground",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    "--bind-interfaces",
                    "--listen-address=127.0.0.1",
                    "--pid-file=",
                    "--user=",
                    // Answers for .test come only from the hosts file: an unknown name is
                    // NXDOMAIN, as from a cluster DNS (without it, REFUSED: no upstream).
                    "--local=/test/",
                ])
                .arg(format!("--port={port}"))
                .arg(format!("--addn-hosts={}", hosts.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                    break;
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                eprintln!("dnsmasq on port {port} exited ({status}): {err}");
                continue;
            }
            started = Some((Dnsmasq(child), addr));
            break;
        }
        let (_dnsmasq, server) = started.expect("dnsmasq started");
        let config = ResolverConfig {
            nameservers: vec![server],
            // The name is found through the search list, as a Service's short name is.
            search: vec!["nowhere.test".into(), "mesh.test".into()],
            ndots: 5,
            timeout: Duration::from_secs(5),
        };
        let got = lookup(&config, "sonde", 5300).unwrap();
        assert_eq!(got.len(), 302, "{got:?}");
        assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), want);
        // And the mesh's peer list from it: every one a peer.
        let cfg = super::super::MeshConfig::parse(
            "name = \"198.18.9.9\"\n[peers]\ndns = \"sonde\"\ndns_port = 5300\n",
        )
        .unwrap();
        let resolve = |name: &str, port: u16| lookup(&config, name, port);
        let peers = super::super::current_peers(&cfg, &mut None, &mut Vec::new(), &resolve);
        assert_eq!(peers.len(), 302);
        // A name that is nowhere: NotFound, not an empty list.
        let e = lookup(&config, "nothing-here.mesh.test.", 5300).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // A name the server refuses (outside .test, and it has no upstream): a failed lookup,
        // which keeps the mesh's last answer, not "no such name".
        let e = lookup(&config, "nothing-here", 5300).unwrap_err();
        assert_ne!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("Refused"), "{e}");
    }
}
