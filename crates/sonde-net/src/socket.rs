//! Socket construction. Every socket sonde uses is made here, with its options in one place.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

/// The agent's TCP listener: `SO_REUSEADDR`; an IPv6 wildcard address also accepts IPv4
/// (`IPV6_V6ONLY` off). Port 0 picks a free port.
pub fn tcp_listen(bind: SocketAddr) -> io::Result<TcpListener> {
    todo!("{bind}")
}

/// The agent's UDP socket on the shared port, with `SO_REUSEADDR` so that [`udp_flow`] sockets
/// can bind the same address and port, and a large receive buffer. Dual-stack like
/// [`tcp_listen`].
pub fn udp_listen(bind: SocketAddr) -> io::Result<UdpSocket> {
    todo!("{bind}")
}

/// A per-flow UDP socket bound to the agent's `local` address and port (shared with
/// [`udp_listen`]) and connected to `peer`: the kernel then delivers that peer's datagrams to
/// this socket rather than the listener. `local` must be the listener's own bound address (an
/// IPv6 wildcard listener gets IPv6 flow sockets, connected to v4-mapped peers as needed).
pub fn udp_flow(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    todo!("{local} {peer}")
}

/// A client UDP socket: ephemeral port, connected to `peer`, large buffers.
pub fn udp_connect(peer: SocketAddr) -> io::Result<UdpSocket> {
    todo!("{peer}")
}

/// A client TCP connection with a connect timeout; `nodelay` sets `TCP_NODELAY`.
pub fn tcp_connect(peer: SocketAddr, timeout: Duration, nodelay: bool) -> io::Result<TcpStream> {
    todo!("{peer} {timeout:?} {nodelay}")
}

/// Total retransmitted segments of a TCP connection (`tcpi_total_retrans` from `TCP_INFO`);
/// `None` where the platform does not say.
pub fn tcp_retransmits(stream: &TcpStream) -> Option<u64> {
    todo!("{stream:?}")
}
