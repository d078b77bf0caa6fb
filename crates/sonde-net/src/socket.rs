//! Socket construction. Every socket sonde uses is made here, with its options in one place.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::sys;

/// The socket buffer size asked for on UDP test sockets. Linux caps it silently at
/// `net.core.rmem_max` / `wmem_max`: at 1 Mpps a 200 KiB default buffer covers well under a
/// millisecond of scheduling delay at the receiver.
pub const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Pending connections the agent's listener queues before refusing (`listen(2)` clamps it to
/// `net.core.somaxconn`).
const LISTEN_BACKLOG: i32 = 1024;

/// How long [`accept`] waits for a connection before it returns [`Accepted::Idle`], so that an
/// accept loop looks at its shutdown flag at least this often without connecting to itself.
pub const ACCEPT_WAKE: Duration = Duration::from_millis(200);

/// What one call of [`accept`] came back with.
#[derive(Debug)]
pub enum Accepted {
    /// A new connection (blocking, without read or write timeouts).
    Connection(TcpStream),
    /// No connection within [`ACCEPT_WAKE`].
    Idle,
    /// The process or the system is out of file descriptors (`EMFILE`, `ENFILE`) or socket
    /// memory (`ENOBUFS`, `ENOMEM`): the connection stays in the backlog, and retrying at once
    /// would spin. The caller should back off.
    OutOfDescriptors,
    /// Anything else (a connection reset before it was accepted): try the next one.
    Failed(io::Error),
}

/// Makes `listener`'s [`accept`] return within [`ACCEPT_WAKE`] when nothing arrives: on Linux the
/// accept honours `SO_RCVTIMEO` (socket(7)); elsewhere the listener is made non-blocking and
/// [`accept`] waits in short sleeps.
pub fn set_accept_wake(listener: &TcpListener) -> io::Result<()> {
    sys::set_accept_wake(listener, ACCEPT_WAKE)
}

/// Accepts one connection from a listener prepared with [`set_accept_wake`], returning within
/// about [`ACCEPT_WAKE`].
pub fn accept(listener: &TcpListener) -> Accepted {
    match sys::accept_with_wake(listener, ACCEPT_WAKE) {
        Ok(stream) => {
            // An accepted socket inherits the listener's timeouts on Linux: clear them.
            let _ = stream.set_read_timeout(None);
            let _ = stream.set_nonblocking(false);
            Accepted::Connection(stream)
        }
        Err(e) if crate::fault::again(&e) => Accepted::Idle,
        Err(e) if sys::out_of_descriptors(&e) => Accepted::OutOfDescriptors,
        Err(e) => Accepted::Failed(e),
    }
}

/// Waits at most `timeout` (on Linux rounded up to a millisecond) for `stream` to have something
/// to read, its end or an error; true when it has, false at the timeout.
pub fn wait_readable(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    sys::wait_readable(stream, timeout)
}

/// What has already arrived on a blocking `stream`, copied into `buf` without being consumed
/// and without waiting (`WouldBlock` when nothing has): on Linux one system call
/// (`MSG_PEEK | MSG_DONTWAIT`), elsewhere the socket is made non-blocking around the peek.
pub fn peek_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    sys::peek_now(stream, buf)
}

/// Raises this process's soft limit on open file descriptors (`RLIMIT_NOFILE`) to its hard
/// limit, so an agent holding many connections meets the limit an administrator set, not the
/// shell's default soft limit (often 1,024). Returns the (soft, hard) limits now in force.
pub fn raise_descriptor_limit() -> io::Result<(u64, u64)> {
    sys::raise_nofile_limit()
}

/// The agent's TCP listener: `SO_REUSEADDR`; an IPv6 wildcard address also accepts IPv4
/// (`IPV6_V6ONLY` off). Port 0 picks a free port.
/// Whether this platform's kernel can hold a TCP sender to a rate (`SO_MAX_PACING_RATE`, Linux
/// only). Where it cannot, an agent with `--max-bitrate` refuses the tests in which it would send
/// TCP, rather than send them unpaced above its cap.
pub const KERNEL_TCP_PACING: bool = cfg!(target_os = "linux");

pub fn tcp_listen(bind: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(bind), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    dual_stack_if_wildcard(&sock, bind)?;
    sock.bind(&bind.into())?;
    sock.listen(LISTEN_BACKLOG)?;
    Ok(sock.into())
}

/// The agent's UDP socket on the shared port, shareable (`SO_REUSEPORT` on Linux: only by the
/// agent's own user) so that [`udp_flow`] sockets can bind the same address and port, and a
/// large receive buffer. Dual-stack like [`tcp_listen`].
pub fn udp_listen(bind: SocketAddr) -> io::Result<UdpSocket> {
    let sock = udp_socket(bind)?;
    share_udp_port(&sock)?;
    dual_stack_if_wildcard(&sock, bind)?;
    sock.bind(&bind.into())?;
    Ok(sock.into())
}

/// A per-flow UDP socket bound to the agent's `local` address and port (shared with
/// [`udp_listen`]) and connected to `peer`: the kernel then delivers that peer's datagrams to
/// this socket rather than the listener. `local` must be the listener's own bound address (an
/// IPv6 wildcard listener gets IPv6 flow sockets, connected to v4-mapped peers as needed).
///
/// Both sockets share the port (`SO_REUSEPORT` on Linux); Linux prefers the connected socket when
/// it looks up the receiver of a datagram (a reuseport group with connected members is not
/// load-balanced), so the listener keeps getting only what no flow socket claims.
pub fn udp_flow(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    let sock = udp_socket(local)?;
    share_udp_port(&sock)?;
    dual_stack_if_wildcard(&sock, local)?;
    sock.bind(&local.into())?;
    sock.connect(&same_family(peer, local).into())?;
    Ok(sock.into())
}

/// Lets the agent's own UDP sockets share one port, and nobody else's. On Linux that is
/// `SO_REUSEPORT`, which shares a port only among sockets of the same effective user
/// (socket(7)); `SO_REUSEADDR` on a UDP socket let any local user, even `nobody`, bind the same
/// port and receive the join datagrams, tokens included. Elsewhere `SO_REUSEADDR` as before.
fn share_udp_port(sock: &Socket) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        sock.set_reuse_port(true)
    }
    #[cfg(not(target_os = "linux"))]
    {
        sock.set_reuse_address(true)
    }
}

/// Where a client socket comes from (`-B ADDR[%DEV]`, `--bind-dev DEV`): its source address
/// and the device it is bound to, both the kernel's choice when `None`. The source port is
/// given per socket (`--cport`), since each stream of a test takes its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bind {
    /// The source address (`-B`); `None` for the route's.
    pub ip: Option<IpAddr>,
    /// `SO_BINDTODEVICE` (`%DEV`, `--bind-dev`; Linux only); `None` for the route's device.
    pub device: Option<String>,
}

impl Bind {
    /// Nothing asked: the kernel picks the address, the device and the port.
    pub fn is_default(&self) -> bool {
        self.ip.is_none() && self.device.is_none()
    }

    /// Binds `sock` (of `peer`'s family) to this source and `port` (0: an ephemeral one).
    /// Nothing is bound when nothing is asked, so the default path is the kernel's as before.
    pub(crate) fn apply(&self, sock: &Socket, peer: SocketAddr, port: u16) -> io::Result<()> {
        if let Some(device) = &self.device {
            sys::bind_device(sock, device).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot bind to device {device:?}: {e}"))
            })?;
        }
        if self.ip.is_none() && port == 0 {
            return Ok(());
        }
        let ip = match (self.ip, peer) {
            (Some(IpAddr::V4(ip)), SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("source address {ip} is IPv4 and the peer {peer} is IPv6"),
                ))
            }
            (Some(IpAddr::V6(ip)), SocketAddr::V4(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("source address {ip} is IPv6 and the peer {peer} is IPv4"),
                ))
            }
            (Some(ip), _) => ip,
            (None, SocketAddr::V4(_)) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            (None, SocketAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        // A fixed source port of an earlier run may still be in TIME_WAIT here.
        if port != 0 {
            sock.set_reuse_address(true)?;
        }
        let local = SocketAddr::new(ip, port);
        sock.bind(&local.into()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot bind the source address {local}: {e}"),
            )
        })
    }
}

/// Why a client socket from a [`Bind`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The source could not be used: the address is not this host's, the port is taken, the
    /// device does not exist or the platform cannot bind to one. The message names which.
    #[error("{0}")]
    Source(io::Error),
    /// The socket or the connection failed.
    #[error("{0}")]
    Connect(io::Error),
}

impl ConnectError {
    /// The error, whichever step it came from.
    pub fn into_io(self) -> io::Error {
        match self {
            Self::Source(e) | Self::Connect(e) => e,
        }
    }
}

/// A client UDP socket: ephemeral port, connected to `peer`, large buffers.
pub fn udp_connect(peer: SocketAddr) -> io::Result<UdpSocket> {
    udp_connect_from(peer, &Bind::default(), 0).map_err(ConnectError::into_io)
}

/// A client UDP socket from `bind` and source port `port` (0: ephemeral), connected to `peer`,
/// large buffers.
pub fn udp_connect_from(
    peer: SocketAddr,
    bind: &Bind,
    port: u16,
) -> Result<UdpSocket, ConnectError> {
    let local = match peer {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let sock = udp_socket(local).map_err(ConnectError::Connect)?;
    bind.apply(&sock, peer, port)
        .map_err(ConnectError::Source)?;
    if bind.ip.is_none() && port == 0 {
        // The address and port are the kernel's (as before, when nothing is asked).
        sock.bind(&local.into()).map_err(ConnectError::Connect)?;
    }
    sock.connect(&peer.into()).map_err(ConnectError::Connect)?;
    Ok(sock.into())
}

/// A client TCP connection with a connect timeout; `nodelay` sets `TCP_NODELAY`.
pub fn tcp_connect(peer: SocketAddr, timeout: Duration, nodelay: bool) -> io::Result<TcpStream> {
    tcp_connect_from(peer, &Bind::default(), 0, timeout, nodelay).map_err(ConnectError::into_io)
}

/// A client TCP connection from `bind` and source port `port` (0: ephemeral), with a connect
/// timeout; `nodelay` sets `TCP_NODELAY`.
pub fn tcp_connect_from(
    peer: SocketAddr,
    bind: &Bind,
    port: u16,
    timeout: Duration,
    nodelay: bool,
) -> Result<TcpStream, ConnectError> {
    let sock = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))
        .map_err(ConnectError::Connect)?;
    bind.apply(&sock, peer, port)
        .map_err(ConnectError::Source)?;
    sock.connect_timeout(&SockAddr::from(peer), timeout)
        .map_err(ConnectError::Connect)?;
    if nodelay {
        sock.set_nodelay(true).map_err(ConnectError::Connect)?;
    }
    Ok(sock.into())
}

/// Total retransmitted segments of a TCP connection (`tcpi_total_retrans` from `TCP_INFO`);
/// `None` where the platform does not say.
pub fn tcp_retransmits(stream: &TcpStream) -> Option<u64> {
    sys::tcp_total_retrans(stream)
}

/// Socket options a peer asks for on the sockets that carry its test data (iperf3's `-w`, `-M`,
/// `-C`, `-N`, `-S`, `--fq-rate`, `--dont-fragment`); `None` leaves the kernel's choice.
/// [`DataOptions::apply_tcp`] and [`DataOptions::apply_udp`] set them on a stream and read back
/// what the kernel granted; [`DataOptions::try_on`] does the same on a throwaway socket, so that
/// a value the kernel refuses is found before any stream is opened; [`tcp_connect_with`] sets
/// them before it connects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataOptions {
    /// `SO_RCVBUF` and `SO_SNDBUF`, bytes (at most `i32::MAX`). Linux reports twice what was
    /// asked (the other half covers its bookkeeping) and caps the request at
    /// `net.core.rmem_max` / `wmem_max`: [`DataOptions::check_granted`] says whether the grant
    /// is below the request.
    pub buffer_bytes: Option<u32>,
    /// `TCP_MAXSEG` (TCP only). A connected socket keeps the MSS its handshake settled (from
    /// the peer's SYN), so there this only has the kernel check the value.
    pub mss: Option<u32>,
    /// `TCP_CONGESTION`, the congestion control algorithm (TCP only).
    pub congestion: Option<String>,
    /// The TOS byte: `IP_TOS` for IPv4 peers (v4-mapped ones on an IPv6 socket included),
    /// `IPV6_TCLASS` for IPv6 peers.
    pub tos: Option<u8>,
    /// `SO_MAX_PACING_RATE`, bytes per second: a cap on what the socket sends.
    pub max_pacing_rate_bytes_per_second: Option<u64>,
    /// `TCP_NODELAY` (TCP only).
    pub nodelay: bool,
    /// DF on every datagram (UDP only): `IP_MTU_DISCOVER` = `IP_PMTUDISC_DO`, or
    /// `IPV6_MTU_DISCOVER` = `IPV6_PMTUDISC_DO` and `IPV6_DONTFRAG` for IPv6 peers.
    pub dont_fragment: bool,
    /// `SO_ZEROCOPY` (TCP only, Linux), so that the senders' `MSG_ZEROCOPY` sends (`-Z`) are
    /// taken as such ([`crate::bulk::TcpSendOptions::zerocopy`]).
    pub zerocopy: bool,
}

/// What the kernel granted for [`DataOptions`], read back with `getsockopt`.
#[derive(Debug, Default)]
pub struct Applied {
    /// `SO_SNDBUF` as read back (whether or not a size was asked for).
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF` as read back (whether or not a size was asked for).
    pub recv_buffer_bytes: Option<usize>,
    /// The congestion control the TCP socket uses, as read back (asked for or the system's
    /// default); `None` for UDP or where the platform does not say.
    pub congestion: Option<String>,
    /// `TCP_MAXSEG` as read back (TCP): on a connected socket, the MSS it sends with.
    pub mss: Option<u32>,
    /// `TCP_NODELAY` as read back (TCP).
    pub nodelay: Option<bool>,
    /// The TOS byte as read back, when one was asked for.
    pub tos: Option<u8>,
    /// `SO_MAX_PACING_RATE` as read back, bytes per second, when one was set.
    pub max_pacing_rate_bytes_per_second: Option<u64>,
    /// Whether datagrams carry DF, as read back (UDP, when asked).
    pub dont_fragment: Option<bool>,
    /// Whether `SO_ZEROCOPY` is set, as read back (TCP, when asked).
    pub zerocopy: Option<bool>,
    /// Why `SO_MAX_PACING_RATE` could not be set. Not an error: like iperf3, the stream then
    /// runs unpaced and the caller says so.
    pub pacing_error: Option<io::Error>,
}

impl Applied {
    /// In the wire's terms ([`sonde_wire::AppliedSocketOptions`]), for the options asked in
    /// `asked` (the others are read back only where they say something about the stream:
    /// buffers, congestion control, MSS).
    pub fn to_wire(
        &self,
        asked: &sonde_wire::SocketOptions,
        tcp: bool,
    ) -> sonde_wire::AppliedSocketOptions {
        let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        sonde_wire::AppliedSocketOptions {
            send_buffer_bytes: self.send_buffer_bytes.map(wide),
            recv_buffer_bytes: self.recv_buffer_bytes.map(wide),
            congestion: self.congestion.clone(),
            mss_bytes: self.mss,
            no_delay: self.nodelay,
            pacing_bits_per_second: self
                .max_pacing_rate_bytes_per_second
                .map(|r| r.saturating_mul(8)),
            tos: self.tos,
            dont_fragment: self.dont_fragment,
            zerocopy: self.zerocopy,
            tcp_ecn_sysctl: (tcp && asked.tos.is_some_and(|t| t & 0b11 != 0))
                .then(sys::tcp_ecn_sysctl)
                .flatten(),
            note: self
                .pacing_error
                .as_ref()
                .map(|e| format!("SO_MAX_PACING_RATE not set, the streams ran unpaced: {e}")),
        }
    }
}

impl From<&sonde_wire::SocketOptions> for DataOptions {
    /// The options of a sonde test's streams (the pacing rate, bits per second, to bytes).
    fn from(o: &sonde_wire::SocketOptions) -> Self {
        Self {
            buffer_bytes: o.window_bytes,
            mss: o.mss_bytes,
            congestion: o.congestion.clone(),
            tos: o.tos,
            max_pacing_rate_bytes_per_second: o.pacing_bits_per_second.map(|b| (b / 8).max(1)),
            nodelay: o.no_delay,
            dont_fragment: o.dont_fragment,
            zerocopy: o.zerocopy,
        }
    }
}

/// An option of [`DataOptions`] the kernel refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataOptionError {
    /// No socket to try the options on ([`DataOptions::try_on`]).
    #[error("cannot open a socket to try the options on: {0}")]
    Socket(io::Error),
    /// The source asked for (`-B`, `--bind-dev`, `--cport`) cannot be used
    /// ([`tcp_connect_from_with`]), as [`ConnectError::Source`].
    #[error("{0}")]
    Source(io::Error),
    /// `SO_RCVBUF` / `SO_SNDBUF` failed.
    #[error("cannot set the socket buffers to {asked} B: {source}")]
    Buffer {
        /// Bytes asked for.
        asked: u32,
        /// The kernel's error.
        source: io::Error,
    },
    /// The kernel granted less than asked ([`DataOptions::check_granted`]).
    #[error(
        "asked for {asked} B socket buffers, the kernel granted {send_bytes} B to send and \
         {recv_bytes} B to receive (net.core.wmem_max / rmem_max cap them)"
    )]
    BufferShort {
        /// Bytes asked for.
        asked: u32,
        /// `SO_SNDBUF` as read back.
        send_bytes: usize,
        /// `SO_RCVBUF` as read back.
        recv_bytes: usize,
    },
    /// `TCP_MAXSEG` failed.
    #[error("cannot set TCP_MAXSEG {mss}: {source}")]
    Mss {
        /// The MSS asked for.
        mss: u32,
        /// The kernel's error.
        source: io::Error,
    },
    /// `TCP_CONGESTION` failed (set, or read back).
    #[error("cannot use TCP congestion control {name:?}: {source}")]
    Congestion {
        /// The algorithm asked for.
        name: String,
        /// The kernel's error (`ENOENT`: no such algorithm here).
        source: io::Error,
    },
    /// `IP_TOS` or `IPV6_TCLASS` failed.
    #[error("cannot set {} {tos:#04x}: {source}", if *.ipv6 { "IPV6_TCLASS" } else { "IP_TOS" })]
    Tos {
        /// The TOS byte asked for.
        tos: u8,
        /// Whether it was `IPV6_TCLASS`.
        ipv6: bool,
        /// The kernel's error.
        source: io::Error,
    },
    /// `TCP_NODELAY` failed.
    #[error("cannot set TCP_NODELAY: {0}")]
    NoDelay(io::Error),
    /// Don't-fragment (`IP_MTU_DISCOVER` / `IPV6_DONTFRAG`) failed.
    #[error("cannot set don't-fragment ({}): {source}", if *.ipv6 { "IPV6_DONTFRAG" } else { "IP_MTU_DISCOVER" })]
    DontFragment {
        /// Whether it was the IPv6 option.
        ipv6: bool,
        /// The kernel's error.
        source: io::Error,
    },
    /// `SO_ZEROCOPY` failed (a kernel before 4.14, or not Linux).
    #[error("cannot set SO_ZEROCOPY: {0}")]
    Zerocopy(io::Error),
}

impl DataOptionError {
    /// The OS error number behind it (`errno`), if any.
    pub fn os_error(&self) -> Option<i32> {
        match self {
            Self::Socket(source)
            | Self::Source(source)
            | Self::Buffer { source, .. }
            | Self::Mss { source, .. }
            | Self::Congestion { source, .. }
            | Self::Tos { source, .. }
            | Self::NoDelay(source)
            | Self::Zerocopy(source)
            | Self::DontFragment { source, .. } => source.raw_os_error(),
            Self::BufferShort { .. } => None,
        }
    }

    /// The sonde client flag this option is set by (`-w`, `-C`, ...), for messages.
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Socket(_) => "socket",
            Self::Source(_) => "-B/--bind-dev/--cport",
            Self::Buffer { .. } | Self::BufferShort { .. } => "-w/--window",
            Self::Mss { .. } => "-M/--set-mss",
            Self::Congestion { .. } => "-C/--congestion",
            Self::Tos { .. } => "-S/--tos/--dscp/--ecn",
            Self::NoDelay(_) => "-N/--no-delay",
            Self::DontFragment { .. } => "--dont-fragment",
            Self::Zerocopy(_) => "-Z/--zerocopy",
        }
    }

    /// Why, in a user's terms: the kernel's reason, with what to look at where sonde knows it
    /// (the congestion controls this kernel has).
    pub fn explain(&self) -> String {
        match self {
            Self::Congestion { name, source } if source.kind() == io::ErrorKind::NotFound => {
                let available = sys::available_congestion().unwrap_or_default();
                format!(
                    "the kernel has no congestion control '{name}' (available: {available}; see \
                     net.ipv4.tcp_available_congestion_control)"
                )
            }
            Self::Congestion { name, source }
                if source.kind() == io::ErrorKind::PermissionDenied =>
            {
                format!(
                    "congestion control '{name}' is not allowed for unprivileged processes \
                     (net.ipv4.tcp_allowed_congestion_control): {source}"
                )
            }
            _ => self.to_string(),
        }
    }
}

impl DataOptions {
    /// Sets the options on a connected TCP stream. The buffers take effect for the data that
    /// follows; see [`DataOptions::mss`] for the MSS.
    pub fn apply_tcp(&self, stream: &TcpStream) -> Result<Applied, DataOptionError> {
        let ipv6 = tos_is_ipv6(stream.local_addr().ok(), stream.peer_addr().ok());
        self.apply(&SockRef::from(stream), true, ipv6)
    }

    /// Sets the options that apply to UDP (buffers, TOS, pacing, don't-fragment) on a
    /// connected UDP socket.
    pub fn apply_udp(&self, sock: &UdpSocket) -> Result<Applied, DataOptionError> {
        let ipv6 = tos_is_ipv6(sock.local_addr().ok(), sock.peer_addr().ok());
        self.apply(&SockRef::from(sock), false, ipv6)
    }

    /// Sets the options on a new, unconnected socket of `local`'s family (TCP with `tcp`,
    /// else UDP) that would talk to `peer`, and closes it: what the kernel refuses there, it
    /// refuses on the streams.
    pub fn try_on(
        &self,
        local: SocketAddr,
        peer: IpAddr,
        tcp: bool,
    ) -> Result<Applied, DataOptionError> {
        let (kind, protocol) = if tcp {
            (Type::STREAM, Protocol::TCP)
        } else {
            (Type::DGRAM, Protocol::UDP)
        };
        let sock = Socket::new(Domain::for_address(local), kind, Some(protocol))
            .map_err(DataOptionError::Socket)?;
        let ipv6 = tos_is_ipv6(Some(local), Some(SocketAddr::new(peer, 0)));
        self.apply(&sock, tcp, ipv6)
    }

    /// A grant below a requested buffer size as an error ([`DataOptionError::BufferShort`]),
    /// as iperf3 makes it; `Ok` when nothing was asked or all of it was granted.
    pub fn check_granted(&self, applied: &Applied) -> Result<(), DataOptionError> {
        let Some(asked) = self.buffer_bytes else {
            return Ok(());
        };
        let want = usize::try_from(asked).unwrap_or(usize::MAX);
        let (send_bytes, recv_bytes) = (
            applied.send_buffer_bytes.unwrap_or(0),
            applied.recv_buffer_bytes.unwrap_or(0),
        );
        if send_bytes < want || recv_bytes < want {
            return Err(DataOptionError::BufferShort {
                asked,
                send_bytes,
                recv_bytes,
            });
        }
        Ok(())
    }

    /// Sets them on `sock`, a TCP socket that connects (or connected) to `peer`, and reads back
    /// what the kernel granted: before the connect, the buffers size the window the SYN offers
    /// and `TCP_MAXSEG` the MSS it announces.
    pub(crate) fn apply_tcp_to(
        &self,
        sock: &Socket,
        peer: SocketAddr,
    ) -> Result<Applied, DataOptionError> {
        self.apply(sock, true, tos_is_ipv6(Some(peer), Some(peer)))
    }

    /// [`DataOptions::apply_tcp_to`] without reading anything back: for a connection of many
    /// (crr), whose first one was read back.
    pub(crate) fn set_tcp_to(
        &self,
        sock: &Socket,
        peer: SocketAddr,
    ) -> Result<(), DataOptionError> {
        self.set(sock, true, tos_is_ipv6(Some(peer), Some(peer)), false)
            .map(drop)
    }

    /// [`DataOptions::apply_tcp`] without reading anything back: for a connection of many (an
    /// agent's crr connections), whose first one was read back.
    ///
    /// # Errors
    /// What the kernel refused, as [`DataOptions::apply_tcp`].
    pub fn set_tcp(&self, stream: &TcpStream) -> Result<(), DataOptionError> {
        let ipv6 = tos_is_ipv6(stream.local_addr().ok(), stream.peer_addr().ok());
        self.set(&SockRef::from(stream), true, ipv6, false)
            .map(drop)
    }

    fn apply(&self, sock: &Socket, tcp: bool, ipv6: bool) -> Result<Applied, DataOptionError> {
        self.set(sock, tcp, ipv6, true)
    }

    /// Sets the options on `sock`; with `read_back`, reads back what the kernel granted (a
    /// `getsockopt` for each), else the [`Applied`] is empty but for a pacing refusal.
    fn set(
        &self,
        sock: &Socket,
        tcp: bool,
        ipv6: bool,
        read_back: bool,
    ) -> Result<Applied, DataOptionError> {
        let mut applied = Applied::default();
        if let Some(asked) = self.buffer_bytes {
            let buffer = |source| DataOptionError::Buffer { asked, source };
            let bytes = i32::try_from(asked)
                .map_err(|_| buffer(io::Error::from_raw_os_error(libc::EINVAL)))?;
            // A non-negative i32 always fits usize.
            let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
            sock.set_recv_buffer_size(bytes).map_err(buffer)?;
            sock.set_send_buffer_size(bytes).map_err(buffer)?;
        }
        if read_back {
            applied.send_buffer_bytes = sock.send_buffer_size().ok();
        }
        if read_back {
            applied.recv_buffer_bytes = sock.recv_buffer_size().ok();
        }
        if tcp {
            if let Some(mss) = self.mss {
                sys::set_tcp_mss(sock, mss)
                    .map_err(|source| DataOptionError::Mss { mss, source })?;
            }
            if read_back {
                applied.mss = sys::tcp_mss(sock).ok();
            }
            if let Some(name) = &self.congestion {
                let refused = |source| DataOptionError::Congestion {
                    name: name.clone(),
                    source,
                };
                sys::set_tcp_congestion(sock, name).map_err(refused)?;
                if read_back {
                    applied.congestion = Some(sys::tcp_congestion(sock).map_err(refused)?);
                }
            } else if read_back {
                applied.congestion = sys::tcp_congestion(sock).ok();
            }
            if self.nodelay {
                sock.set_nodelay(true).map_err(DataOptionError::NoDelay)?;
            }
            if read_back {
                applied.nodelay = sock.nodelay().ok();
            }
            if self.zerocopy {
                sys::set_zerocopy(sock).map_err(DataOptionError::Zerocopy)?;
                if read_back {
                    applied.zerocopy = sys::zerocopy(sock).ok();
                }
            }
        }
        if let Some(tos) = self.tos {
            let set = if ipv6 {
                sys::set_ipv6_tclass(sock, tos)
            } else {
                sys::set_ip_tos(sock, tos)
            };
            set.map_err(|source| DataOptionError::Tos { tos, ipv6, source })?;
            if read_back {
                applied.tos = sys::tos(sock, ipv6).ok();
            }
        }
        if self.dont_fragment && !tcp {
            sys::set_dont_fragment(sock, ipv6)
                .map_err(|source| DataOptionError::DontFragment { ipv6, source })?;
            if read_back {
                applied.dont_fragment = sys::dont_fragment(sock, ipv6).ok();
            }
        }
        if let Some(rate) = self.max_pacing_rate_bytes_per_second {
            match sys::set_max_pacing_rate(sock, rate) {
                Ok(()) => {
                    if read_back {
                        applied.max_pacing_rate_bytes_per_second = sys::max_pacing_rate(sock).ok();
                    }
                }
                Err(e) => applied.pacing_error = Some(e),
            }
        }
        Ok(applied)
    }
}

/// The path MTU the kernel knows for a connected UDP socket (`IP_MTU` / `IPV6_MTU`), bytes:
/// the largest datagram, headers included, that leaves it whole under don't-fragment.
pub fn path_mtu(sock: &UdpSocket) -> io::Result<u32> {
    let ipv6 = tos_is_ipv6(sock.local_addr().ok(), sock.peer_addr().ok());
    sys::path_mtu(sys::sock_ref(sock), ipv6)
}

/// `TCP_MAXSEG` of a connected stream: the MSS it sends with now, bytes (`sonde mtu`).
///
/// # Errors
/// Not available on this platform, or the stream is closed.
pub fn tcp_mss(stream: &std::net::TcpStream) -> io::Result<u32> {
    sys::tcp_mss(&socket2::SockRef::from(stream))
}

/// Connects a TCP stream to `peer` with `opts` set before the handshake (the buffers size the
/// window it offers, `TCP_MAXSEG` the MSS its SYN announces), within `timeout`; returns the
/// stream and what the kernel granted, read back once connected.
pub fn tcp_connect_with(
    peer: SocketAddr,
    timeout: Duration,
    opts: &DataOptions,
) -> Result<(TcpStream, Applied), DataOptionError> {
    tcp_connect_from_with(peer, &Bind::default(), 0, timeout, opts)
}

/// [`tcp_connect_with`] from `bind` and source port `port` (0: ephemeral), as
/// [`tcp_connect_from`] binds; a source that cannot be used is a [`DataOptionError::Source`].
pub fn tcp_connect_from_with(
    peer: SocketAddr,
    bind: &Bind,
    port: u16,
    timeout: Duration,
    opts: &DataOptions,
) -> Result<(TcpStream, Applied), DataOptionError> {
    let sock = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))
        .map_err(DataOptionError::Socket)?;
    bind.apply(&sock, peer, port)
        .map_err(DataOptionError::Source)?;
    let ipv6 = tos_is_ipv6(Some(peer), Some(peer));
    opts.apply(&sock, true, ipv6)?;
    sock.connect_timeout(&SockAddr::from(peer), timeout)
        .map_err(DataOptionError::Socket)?;
    let stream = TcpStream::from(sock);
    let applied = opts.apply_tcp(&stream)?;
    Ok((stream, applied))
}

/// Whether a socket's TOS byte is `IPV6_TCLASS` rather than `IP_TOS`: only for an IPv6
/// socket with a genuinely IPv6 peer. A v4-mapped peer gets IPv4 packets, which carry
/// `IP_TOS` (Linux keeps the two apart even on one socket).
fn tos_is_ipv6(local: Option<SocketAddr>, peer: Option<SocketAddr>) -> bool {
    let v6_socket = matches!(local, Some(SocketAddr::V6(_)));
    let v4_peer = match peer {
        Some(SocketAddr::V4(_)) => true,
        Some(SocketAddr::V6(p)) => p.ip().to_ipv4_mapped().is_some(),
        None => false,
    };
    v6_socket && !v4_peer
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
            ..UdpJoin::default()
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

    /// A free TCP and UDP port on 127.0.0.2 (`-B`'s address in these tests).
    fn free_port() -> u16 {
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[test]
    fn a_bound_source_is_what_the_peer_sees() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let bind = Bind {
            ip: Some("127.0.0.2".parse().unwrap()),
            device: None,
        };
        let port = free_port();
        let _c = tcp_connect_from(
            listener.local_addr().unwrap(),
            &bind,
            port,
            SECOND.unwrap(),
            true,
        )
        .unwrap();
        let (_s, peer) = listener.accept().unwrap();
        assert_eq!(peer, SocketAddr::from(([127, 0, 0, 2], port)));

        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = free_port();
        let c = udp_connect_from(server.local_addr().unwrap(), &bind, port).unwrap();
        c.send(b"x").unwrap();
        server.set_read_timeout(SECOND).unwrap();
        let (_, from) = server.recv_from(&mut [0u8; 8]).unwrap();
        assert_eq!(from, SocketAddr::from(([127, 0, 0, 2], port)));
    }

    #[test]
    fn a_source_that_cannot_be_used_is_a_source_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = listener.local_addr().unwrap();
        // An address of the other family, and one this host does not have (TEST-NET-1).
        for ip in ["::1", "192.0.2.1"] {
            let bind = Bind {
                ip: Some(ip.parse().unwrap()),
                device: None,
            };
            let e = tcp_connect_from(peer, &bind, 0, SECOND.unwrap(), false).unwrap_err();
            assert!(matches!(e, ConnectError::Source(_)), "{ip}: {e:?}");
            let e = udp_connect_from(peer, &bind, 0).unwrap_err();
            assert!(matches!(e, ConnectError::Source(_)), "{ip}: {e:?}");
        }
        // A device that does not exist (or, off Linux, no device binding at all).
        let bind = Bind {
            ip: None,
            device: Some("no-such-dev0".into()),
        };
        let e = tcp_connect_from(peer, &bind, 0, SECOND.unwrap(), false).unwrap_err();
        assert!(matches!(e, ConnectError::Source(_)), "{e:?}");
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
    fn peek_now_does_not_wait_nor_consume_and_wait_readable_sees_arrival() {
        let listener = tcp_listen(loopback_v4()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = tcp_connect(addr, Duration::from_secs(1), true).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 16];
        // Nothing yet: no wait (the socket is blocking), and the wait times out.
        let e = peek_now(&server, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(!wait_readable(&server, Duration::from_millis(1)).unwrap());
        client.write_all(b"probe").unwrap();
        assert!(wait_readable(&server, Duration::from_secs(5)).unwrap());
        assert_eq!(peek_now(&server, &mut buf).unwrap(), 5);
        // Not consumed: still there, and still blocking for a plain read.
        assert_eq!(peek_now(&server, &mut buf).unwrap(), 5);
        let mut server = server;
        server.set_read_timeout(SECOND).unwrap();
        let mut got = [0u8; 5];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"probe");
        assert_eq!(&buf[..5], b"probe");
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

    /// A loopback TCP connection through a listener on `bind`, from a client connecting to
    /// `to`: (the client's end, the accepted end).
    #[cfg(target_os = "linux")]
    fn tcp_pair(bind: SocketAddr, to: IpAddr) -> (TcpStream, TcpStream) {
        let listener = tcp_listen(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = tcp_connect(SocketAddr::new(to, port), Duration::from_secs(1), false).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        (client, accepted)
    }

    #[cfg(target_os = "linux")]
    fn sysctl(name: &str) -> String {
        std::fs::read_to_string(format!("/proc/sys/{name}"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn data_options_reach_an_accepted_tcp_socket() {
        let (_client, accepted) = tcp_pair(loopback_v4(), Ipv4Addr::LOCALHOST.into());
        let sock = SockRef::from(&accepted);
        // Linux grants exactly twice a request up to net.core.{w,r}mem_max (socket(7)), which
        // tells the request apart from whatever the connection had before.
        let asked = ["net/core/rmem_max", "net/core/wmem_max"]
            .iter()
            .map(|n| sysctl(n).parse::<usize>().unwrap())
            .fold(256 << 10, usize::min);
        let opts = DataOptions {
            buffer_bytes: Some(u32::try_from(asked).unwrap()),
            mss: Some(1000),
            // reno is built into every Linux kernel.
            congestion: Some("reno".into()),
            tos: Some(0x10),
            max_pacing_rate_bytes_per_second: Some(1_250_000),
            nodelay: true,
            // UDP only: a TCP stream is left as it is.
            dont_fragment: true,
            zerocopy: true,
        };
        let applied = opts.apply_tcp(&accepted).unwrap();
        assert_eq!(applied.zerocopy, Some(true));
        opts.check_granted(&applied).unwrap();
        assert_eq!(applied.nodelay, Some(true));
        assert!(sock.nodelay().unwrap());
        assert_eq!(applied.tos, Some(0x10));
        assert_eq!(applied.max_pacing_rate_bytes_per_second, Some(1_250_000));
        assert_eq!(applied.dont_fragment, None);
        // Loopback's MSS, as the handshake settled it: TCP_MAXSEG on a connected socket does
        // not change it.
        assert!(applied.mss.is_some_and(|m| m > 1000), "{:?}", applied.mss);
        let (send, recv) = (
            sock.send_buffer_size().unwrap(),
            sock.recv_buffer_size().unwrap(),
        );
        assert_eq!((send, recv), (2 * asked, 2 * asked));
        assert_eq!(applied.send_buffer_bytes, Some(send));
        assert_eq!(applied.recv_buffer_bytes, Some(recv));
        assert_eq!(sys::tcp_congestion(&sock).unwrap(), "reno");
        assert_eq!(applied.congestion.as_deref(), Some("reno"));
        assert_eq!(sock.tos().unwrap(), 0x10);
        assert_eq!(sys::max_pacing_rate(&sock).unwrap(), 1_250_000);
        assert!(applied.pacing_error.is_none());

        // Nothing asked: nothing changes, and the congestion control in use is still reported.
        let (_client, plain) = tcp_pair(loopback_v4(), Ipv4Addr::LOCALHOST.into());
        let applied = DataOptions::default().apply_tcp(&plain).unwrap();
        assert_eq!(
            applied.congestion.as_deref(),
            Some(sysctl("net/ipv4/tcp_congestion_control").as_str())
        );
        // The buffers are read back all the same: the result shows the defaults.
        assert!(applied.send_buffer_bytes.is_some());
        assert_eq!(applied.tos, None);
        assert_eq!(SockRef::from(&plain).tos().unwrap(), 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn options_set_before_connect_reach_the_handshake_and_both_ends() {
        let listener = tcp_listen(loopback_v4()).unwrap();
        let opts = DataOptions {
            mss: Some(1_000),
            nodelay: true,
            ..DataOptions::default()
        };
        let (client, applied) = tcp_connect_with(
            listener.local_addr().unwrap(),
            Duration::from_secs(1),
            &opts,
        )
        .unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // The SYN announced the MSS: both ends send segments of at most 1,000 bytes (less the
        // TCP options each carries, timestamps: 12 bytes).
        let mss = applied.mss.unwrap();
        assert!((900..=1_000).contains(&mss), "{mss}");
        let theirs = SockRef::from(&accepted).mss().unwrap();
        assert!((900..=1_000).contains(&theirs), "{theirs}");
        assert!(client.nodelay().unwrap());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn dont_fragment_is_set_read_back_and_a_datagram_over_the_mtu_is_explained() {
        let listener = udp_listen(loopback_v4()).unwrap();
        let sock = udp_connect(listener.local_addr().unwrap()).unwrap();
        let df = DataOptions {
            dont_fragment: true,
            ..DataOptions::default()
        };
        let applied = df.apply_udp(&sock).unwrap();
        assert_eq!(applied.dont_fragment, Some(true));
        // Loopback's MTU is 65,536: a datagram of 65,507 payload bytes is the most IPv4 takes
        // at all, so look at the error path through the kernel's answer to a larger MTU probe.
        let mtu = sys::path_mtu(sys::sock_ref(&sock), false).unwrap();
        assert!(mtu >= 1_280, "{mtu}");
        let e = crate::bulk::explain_too_long(
            &sock,
            1_472,
            io::Error::from_raw_os_error(libc::EMSGSIZE),
        );
        let text = e.to_string();
        assert!(text.contains(&format!("path MTU of {mtu} B")), "{text}");
        assert!(
            text.contains("1500 B") && text.contains("--dont-fragment"),
            "{text}"
        );
        // Other errors pass as they are.
        let other =
            crate::bulk::explain_too_long(&sock, 10, io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(other.raw_os_error(), Some(libc::EPERM));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_missing_congestion_control_is_explained_with_the_available_ones() {
        let e = DataOptionError::Congestion {
            name: "bbr2".into(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        let available = sys::available_congestion().unwrap();
        assert_eq!(e.flag(), "-C/--congestion");
        assert_eq!(
            e.explain(),
            format!(
                "the kernel has no congestion control 'bbr2' (available: {available}; see \
                 net.ipv4.tcp_available_congestion_control)"
            )
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_congestion_controls_the_kernel_lists_are_asked_for() {
        assert!(sys::congestion_listed("reno bbr cubic\n", "bbr"));
        assert!(!sys::congestion_listed("reno bbr cubic\n", "vegas"));
        assert!(!sys::congestion_listed("reno cubic", "cub"));
        assert!(!sys::congestion_listed("", "reno"));
        // A real algorithm the kernel has not loaded: refused without loading its module.
        let path = "/proc/sys/net/ipv4/tcp_available_congestion_control";
        let before = std::fs::read_to_string(path).unwrap();
        let Some(unloaded) = ["vegas", "htcp", "hybla", "illinois", "westwood"]
            .into_iter()
            .find(|n| !sys::congestion_listed(&before, n))
        else {
            return;
        };
        let (_client, accepted) = tcp_pair(loopback_v4(), Ipv4Addr::LOCALHOST.into());
        let cc = DataOptions {
            congestion: Some(unloaded.into()),
            ..DataOptions::default()
        };
        let e = cc.apply_tcp(&accepted).unwrap_err();
        assert_eq!(e.os_error(), Some(libc::ENOENT), "{e}");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            before,
            "a module was loaded"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn refused_options_say_which_and_why() {
        let (_client, accepted) = tcp_pair(loopback_v4(), Ipv4Addr::LOCALHOST.into());
        let cc = DataOptions {
            congestion: Some("nosuchcc".into()),
            ..DataOptions::default()
        };
        let e = cc.apply_tcp(&accepted).unwrap_err();
        assert!(matches!(&e, DataOptionError::Congestion { name, .. } if name == "nosuchcc"));
        assert_eq!(e.os_error(), Some(libc::ENOENT));
        // The throwaway socket finds the same, before any stream exists.
        let local = loopback_v4();
        let e = cc
            .try_on(local, Ipv4Addr::LOCALHOST.into(), true)
            .unwrap_err();
        assert_eq!(e.os_error(), Some(libc::ENOENT));
        // UDP has no congestion control: nothing to refuse.
        assert!(cc.try_on(local, Ipv4Addr::LOCALHOST.into(), false).is_ok());

        let mss = DataOptions {
            mss: Some(50),
            ..DataOptions::default()
        };
        let e = mss
            .try_on(local, Ipv4Addr::LOCALHOST.into(), true)
            .unwrap_err();
        assert!(matches!(e, DataOptionError::Mss { mss: 50, .. }), "{e}");
        assert_eq!(e.os_error(), Some(libc::EINVAL));

        let huge = DataOptions {
            buffer_bytes: Some(u32::MAX),
            ..DataOptions::default()
        };
        let e = huge
            .try_on(local, Ipv4Addr::LOCALHOST.into(), true)
            .unwrap_err();
        assert_eq!(e.os_error(), Some(libc::EINVAL), "{e}");

        // Linux grants at most twice net.core.{r,w}mem_max, even to root.
        let max: u64 = ["net/core/rmem_max", "net/core/wmem_max"]
            .iter()
            .map(|n| sysctl(n).parse::<u64>().unwrap())
            .min()
            .unwrap();
        let asked = i32::MAX.unsigned_abs();
        if max * 2 >= u64::from(asked) {
            eprintln!(
                "net.core.rmem_max / wmem_max allow {asked} B: the short grant is not tested"
            );
            return;
        }
        let short = DataOptions {
            buffer_bytes: Some(asked),
            ..DataOptions::default()
        };
        // Not an error to set: the grant is read back, and a caller that wants all of it
        // (iperf3's server) checks it.
        let applied = short.apply_tcp(&accepted).unwrap();
        let e = short.check_granted(&applied).unwrap_err();
        assert!(
            matches!(e, DataOptionError::BufferShort { asked: a, send_bytes, recv_bytes }
                if a == asked && send_bytes < asked as usize && recv_bytes < asked as usize),
            "{e}"
        );
        assert_eq!(e.os_error(), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn tos_follows_the_peer_family_and_reaches_udp_flows() {
        let tos = DataOptions {
            tos: Some(0x10),
            buffer_bytes: Some(256 << 10),
            ..DataOptions::default()
        };
        let Ok(listener) = udp_listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))) else {
            eprintln!("IPv6 unavailable here: skipped");
            return;
        };
        let local = listener.local_addr().unwrap();

        // An IPv4 client of the dual-stack port: its packets are IPv4, marked by IP_TOS.
        let client = udp_connect(SocketAddr::from((Ipv4Addr::LOCALHOST, local.port()))).unwrap();
        let flow = udp_flow(local, client.local_addr().unwrap()).unwrap();
        let applied = tos.apply_udp(&flow).unwrap();
        let sock = SockRef::from(&flow);
        assert_eq!(sock.tos().unwrap(), 0x10);
        assert_eq!(sock.tclass_v6().unwrap(), 0);
        assert_eq!(applied.congestion, None);
        // -w replaces the large UDP default too.
        assert_eq!(
            applied.recv_buffer_bytes,
            Some(sock.recv_buffer_size().unwrap())
        );
        assert!(sock.recv_buffer_size().unwrap() < UDP_BUFFER_BYTES);

        // An IPv6 client: IPV6_TCLASS.
        let Ok(client6) = udp_connect(SocketAddr::from((Ipv6Addr::LOCALHOST, local.port()))) else {
            eprintln!("no ::1 here: the IPv6 half skipped");
            return;
        };
        let flow6 = udp_flow(local, client6.local_addr().unwrap()).unwrap();
        tos.apply_udp(&flow6).unwrap();
        let sock6 = SockRef::from(&flow6);
        assert_eq!(sock6.tclass_v6().unwrap(), 0x10);
        assert_eq!(sock6.tos().unwrap(), 0);

        // And a TCP stream accepted by a dual-stack listener from IPv4.
        let (_c, accepted) = tcp_pair(
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
            Ipv4Addr::LOCALHOST.into(),
        );
        tos.apply_tcp(&accepted).unwrap();
        assert_eq!(SockRef::from(&accepted).tos().unwrap(), 0x10);
    }

    #[test]
    fn tos_option_is_chosen_by_what_the_packets_are() {
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 1));
        let mapped = SocketAddr::from((Ipv4Addr::LOCALHOST.to_ipv6_mapped(), 1));
        assert!(!tos_is_ipv6(Some(v4), Some(v4)));
        assert!(!tos_is_ipv6(Some(v6), Some(v4)));
        assert!(!tos_is_ipv6(Some(v6), Some(mapped)));
        assert!(tos_is_ipv6(Some(v6), Some(v6)));
        // Unconnected: the socket's family decides.
        assert!(tos_is_ipv6(Some(v6), None));
        assert!(!tos_is_ipv6(Some(v4), None));
    }
}
