//! Socket construction. Every socket sonde uses is made here, with its options in one place.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::sys;

/// The socket buffer size asked for on UDP test sockets. Linux caps it silently at
/// `net.core.rmem_max` / `wmem_max`: at 1 Mpps a 200 KiB default buffer covers well under a
/// millisecond of scheduling delay at the receiver.
pub const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Pending connections the agent's listener queues before refusing (`listen(2)` clamps it to
/// `net.core.somaxconn`).
const LISTEN_BACKLOG: i32 = 1024;

/// The agent's TCP listener: `SO_REUSEADDR`; an IPv6 wildcard address also accepts IPv4
/// (`IPV6_V6ONLY` off). Port 0 picks a free port.
pub fn tcp_listen(bind: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(bind), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    dual_stack_if_wildcard(&sock, bind)?;
    sock.bind(&bind.into())?;
    sock.listen(LISTEN_BACKLOG)?;
    Ok(sock.into())
}

/// The agent's UDP socket on the shared port, with `SO_REUSEADDR` so that [`udp_flow`] sockets
/// can bind the same address and port, and a large receive buffer. Dual-stack like
/// [`tcp_listen`].
pub fn udp_listen(bind: SocketAddr) -> io::Result<UdpSocket> {
    let sock = udp_socket(bind)?;
    sock.set_reuse_address(true)?;
    dual_stack_if_wildcard(&sock, bind)?;
    sock.bind(&bind.into())?;
    Ok(sock.into())
}

/// A per-flow UDP socket bound to the agent's `local` address and port (shared with
/// [`udp_listen`]) and connected to `peer`: the kernel then delivers that peer's datagrams to
/// this socket rather than the listener. `local` must be the listener's own bound address (an
/// IPv6 wildcard listener gets IPv6 flow sockets, connected to v4-mapped peers as needed).
///
/// Both sockets carry `SO_REUSEADDR`; Linux prefers the connected socket when it looks up the
/// receiver of a datagram, so the listener keeps getting only what no flow socket claims.
pub fn udp_flow(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    let sock = udp_socket(local)?;
    sock.set_reuse_address(true)?;
    dual_stack_if_wildcard(&sock, local)?;
    sock.bind(&local.into())?;
    sock.connect(&same_family(peer, local).into())?;
    Ok(sock.into())
}

/// A client UDP socket: ephemeral port, connected to `peer`, large buffers.
pub fn udp_connect(peer: SocketAddr) -> io::Result<UdpSocket> {
    let local = match peer {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let sock = udp_socket(local)?;
    sock.bind(&local.into())?;
    sock.connect(&peer.into())?;
    Ok(sock.into())
}

/// A client TCP connection with a connect timeout; `nodelay` sets `TCP_NODELAY`.
pub fn tcp_connect(peer: SocketAddr, timeout: Duration, nodelay: bool) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))?;
    sock.connect_timeout(&SockAddr::from(peer), timeout)?;
    if nodelay {
        sock.set_nodelay(true)?;
    }
    Ok(sock.into())
}

/// Total retransmitted segments of a TCP connection (`tcpi_total_retrans` from `TCP_INFO`);
/// `None` where the platform does not say.
pub fn tcp_retransmits(stream: &TcpStream) -> Option<u64> {
    sys::tcp_total_retrans(stream)
}

/// A UDP socket of `addr`'s family with [`UDP_BUFFER_BYTES`] asked for in both directions.
fn udp_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_recv_buffer_size(UDP_BUFFER_BYTES)?;
    sock.set_send_buffer_size(UDP_BUFFER_BYTES)?;
    Ok(sock)
}

/// `[::]` also takes IPv4 (as v4-mapped addresses), whatever `net.ipv6.bindv6only` says.
fn dual_stack_if_wildcard(sock: &Socket, bind: SocketAddr) -> io::Result<()> {
    if let SocketAddr::V6(v6) = bind {
        if v6.ip().is_unspecified() {
            sock.set_only_v6(false)?;
        }
    }
    Ok(())
}

/// `peer` in the address family of `local`: an IPv4 peer of an IPv6 socket becomes its
/// v4-mapped address, and a v4-mapped peer of an IPv4 socket becomes plain IPv4. Anything else
/// is returned as is (and `connect` then reports the mismatch).
fn same_family(peer: SocketAddr, local: SocketAddr) -> SocketAddr {
    match (local, peer) {
        (SocketAddr::V6(_), SocketAddr::V4(p)) => {
            SocketAddr::V6(SocketAddrV6::new(p.ip().to_ipv6_mapped(), p.port(), 0, 0))
        }
        (SocketAddr::V4(_), SocketAddr::V6(p)) => match p.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::V4(SocketAddrV4::new(ip, p.port())),
            None => peer,
        },
        _ => peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    use sonde_wire::{Token, UdpJoin};

    const SECOND: Option<Duration> = Some(Duration::from_secs(1));

    fn loopback_v4() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
    }

    /// A client's join goes to the listener, which learns the client's address from it.
    fn join_via_listener(listener: &UdpSocket, client: &UdpSocket) -> SocketAddr {
        let join = UdpJoin {
            ack: false,
            flow: 0,
            token: Token(7),
        };
        client.send(&join.encode()).unwrap();
        listener.set_read_timeout(SECOND).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = listener.recv_from(&mut buf).unwrap();
        assert_eq!(UdpJoin::decode(&buf[..n]), Ok(join));
        from
    }

    /// After the flow socket exists, the client's datagrams reach it and not the listener, and
    /// its replies reach the client (which is connected to the listener's address).
    fn assert_flow_takes_over(listener: &UdpSocket, flow: &UdpSocket, client: &UdpSocket) {
        client.send(b"data").unwrap();
        flow.set_read_timeout(SECOND).unwrap();
        let mut buf = [0u8; 64];
        let n = flow.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"data");

        listener.set_nonblocking(true).unwrap();
        let err = listener.recv_from(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);

        flow.send(b"reply").unwrap();
        client.set_read_timeout(SECOND).unwrap();
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"reply");
    }

    #[test]
    fn flow_socket_shares_the_listener_port_and_takes_the_peer_datagrams() {
        let listener = udp_listen(loopback_v4()).unwrap();
        let local = listener.local_addr().unwrap();
        assert_ne!(local.port(), 0);
        let client = udp_connect(local).unwrap();
        let from = join_via_listener(&listener, &client);
        assert_eq!(from, client.local_addr().unwrap());

        let flow = udp_flow(local, from).unwrap();
        assert_eq!(flow.local_addr().unwrap(), local);
        assert_eq!(flow.peer_addr().unwrap(), from);
        assert_flow_takes_over(&listener, &flow, &client);

        // Another client still reaches the listener.
        let other = udp_connect(local).unwrap();
        let from_other = join_via_listener(&listener, &other);
        assert_eq!(from_other, other.local_addr().unwrap());
    }

    #[test]
    fn dual_stack_listener_serves_an_ipv4_client_through_a_v6_flow_socket() {
        let Ok(listener) = udp_listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))) else {
            eprintln!("IPv6 unavailable here: skipped");
            return;
        };
        let local = listener.local_addr().unwrap();
        let client = udp_connect(SocketAddr::from((Ipv4Addr::LOCALHOST, local.port()))).unwrap();
        let from = join_via_listener(&listener, &client);
        // The listener sees the v4-mapped address; the flow is given the plain IPv4 one.
        let SocketAddr::V6(mapped) = from else {
            panic!("a v6 socket reports v6 addresses, got {from}");
        };
        let v4 = SocketAddr::from((mapped.ip().to_ipv4_mapped().unwrap(), mapped.port()));
        assert_eq!(v4, client.local_addr().unwrap());

        let flow = udp_flow(local, v4).unwrap();
        assert_eq!(flow.peer_addr().unwrap(), from);
        assert_flow_takes_over(&listener, &flow, &client);
    }

    #[test]
    fn udp_sockets_get_large_buffers() {
        let sock = udp_connect(SocketAddr::from((Ipv4Addr::LOCALHOST, 9))).unwrap();
        let sock = Socket::from(sock);
        // The kernel may cap the request (and Linux doubles what it grants), but it must be
        // well above the usual 208 KiB default.
        assert!(sock.recv_buffer_size().unwrap() > 256 << 10);
        assert!(sock.send_buffer_size().unwrap() > 256 << 10);
    }

    #[test]
    fn tcp_listener_and_client_connect_on_loopback() {
        let listener = tcp_listen(loopback_v4()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = tcp_connect(addr, Duration::from_secs(1), true).unwrap();
        assert!(client.nodelay().unwrap());
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"ping").unwrap();
        server.set_read_timeout(SECOND).unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        if cfg!(target_os = "linux") {
            assert_eq!(tcp_retransmits(&client), Some(0));
        }
    }

    #[test]
    fn dual_stack_tcp_listener_accepts_ipv4() {
        let Ok(listener) = tcp_listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))) else {
            eprintln!("IPv6 unavailable here: skipped");
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let client = tcp_connect(
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(1),
            false,
        )
        .unwrap();
        let (_server, from) = listener.accept().unwrap();
        let SocketAddr::V6(from) = from else {
            panic!("a v6 listener reports v6 peers, got {from}");
        };
        assert_eq!(
            SocketAddr::from((from.ip().to_ipv4_mapped().unwrap(), from.port())),
            client.local_addr().unwrap()
        );
    }

    #[test]
    fn peers_are_converted_to_the_local_family() {
        let v4 = SocketAddr::from(([127, 0, 0, 1], 5));
        let mapped = SocketAddr::from((Ipv4Addr::LOCALHOST.to_ipv6_mapped(), 5));
        let any4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 1));
        let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 1));
        assert_eq!(same_family(v4, any6), mapped);
        assert_eq!(same_family(mapped, any4), v4);
        assert_eq!(same_family(v4, any4), v4);
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 5));
        assert_eq!(same_family(v6, any4), v6);
        assert_eq!(same_family(v6, any6), v6);
    }
}
