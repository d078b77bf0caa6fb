//! Everywhere but Linux: no GSO, no batching, no `TCP_INFO`. One datagram per system call, and
//! no `unsafe`.

use std::io;
use std::net::{TcpStream, UdpSocket};

/// No GSO here; kept so callers size their buffers the same way on every platform.
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;

/// See the Linux value.
pub(crate) const MAX_GSO_BYTES: usize = 65_507;

fn unsupported() -> io::Error {
    io::Error::from(io::ErrorKind::Unsupported)
}

/// Always fails with [`io::ErrorKind::Unsupported`] (see [`gso_refused`]).
pub(crate) fn send_segments(_sock: &UdpSocket, _buf: &[u8], _segment: u16) -> io::Result<usize> {
    Err(unsupported())
}

/// True for the error [`send_segments`] returns here.
pub(crate) fn gso_refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
}

/// True for the error [`Batch::send`] returns here.
pub(crate) fn batch_unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
}

/// A UDP socket's report of an ICMP port unreachable for an earlier datagram (`ECONNREFUSED`).
pub(crate) fn port_unreachable(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionRefused
}

/// Not distinguishable portably; transient send faults show up as `WouldBlock` instead.
pub(crate) fn no_buffer_space(_e: &io::Error) -> bool {
    false
}

/// One datagram per call.
#[derive(Debug)]
pub(crate) struct Batch {
    len: usize,
}

// Same methods as the Linux `Batch`, so some take `self` only for that.
#[allow(clippy::unused_self)]
impl Batch {
    /// Ignores `capacity`: one datagram per call.
    pub(crate) fn new(_capacity: usize) -> Self {
        Self { len: 0 }
    }

    /// As [`Batch::new`]: no `UDP_GRO` here.
    pub(crate) fn with_segments(capacity: usize) -> Self {
        Self::new(capacity)
    }

    /// Never coalesced here.
    pub(crate) fn segment_size(&self, _i: usize) -> Option<usize> {
        None
    }

    /// Never read here (no [`enable_recv_tos`]).
    pub(crate) fn tos(&self, _i: usize) -> Option<u8> {
        None
    }

    /// Always 1.
    pub(crate) fn capacity(&self) -> usize {
        1
    }

    /// Always fails with [`io::ErrorKind::Unsupported`]: the caller falls back to `send`.
    pub(crate) fn send(
        &mut self,
        _sock: &UdpSocket,
        _buf: &[u8],
        _size: usize,
    ) -> io::Result<usize> {
        Err(unsupported())
    }

    /// Receives one datagram into the first `size` bytes of `buf`.
    pub(crate) fn recv(
        &mut self,
        sock: &UdpSocket,
        buf: &mut [u8],
        size: usize,
    ) -> io::Result<usize> {
        let Some(slot) = buf.get_mut(..size).filter(|s| !s.is_empty()) else {
            return Ok(0);
        };
        self.len = sock.recv(slot)?;
        Ok(1)
    }

    /// Bytes of the datagram of the last [`Batch::recv`].
    pub(crate) fn datagram_len(&self, _i: usize) -> usize {
        self.len
    }
}

/// Not available portably.
pub(crate) fn tcp_total_retrans(_stream: &TcpStream) -> Option<u64> {
    None
}

/// Not available portably (`getrusage` needs `unsafe`, which this module does without).
pub(crate) fn rusage(_thread: bool) -> io::Result<crate::cpu::CpuSnapshot> {
    Err(unsupported())
}

/// Not available portably.
pub(crate) fn tcp_info_bytes(_stream: &TcpStream, _buf: &mut [u8]) -> io::Result<usize> {
    Err(unsupported())
}

/// Not available portably: every offload unknown.
pub(crate) fn nic_offloads(_interface: &str) -> sonde_wire::NicOffloads {
    sonde_wire::NicOffloads::default()
}

/// Not available portably.
pub(crate) fn nic_driver(_interface: &str) -> Option<String> {
    None
}

/// Not available portably.
pub(crate) fn driver_stats(_interface: &str) -> io::Result<Vec<(String, u64)>> {
    Err(unsupported())
}

/// Not available portably.
pub(crate) fn interface_addresses() -> io::Result<Vec<(String, std::net::IpAddr)>> {
    Err(unsupported())
}

// Kernel timestamps and the host's monotonic clock, for latency's inner view.

/// No host-wide monotonic clock without `unsafe` here: the process's, from its first use. Two
/// processes on one host then disagree by their start times, which the offset estimate finds.
pub(crate) fn monotonic_ns() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn udp_enable_timestamps(_sock: &UdpSocket, _tx: bool) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn tcp_enable_timestamps(_stream: &TcpStream, _tx: bool) -> io::Result<()> {
    Err(unsupported())
}

/// Nothing to turn off.
pub(crate) fn disable_timestamps(_fd: super::SockRef<'_>) {}

/// A plain `recv`: never a timestamp.
pub(crate) fn udp_recv_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, Option<u64>)> {
    sock.recv(buf).map(|n| (n, None))
}

/// A plain `read`: never a timestamp.
pub(crate) fn tcp_recv_stamped(
    stream: &TcpStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<u64>)> {
    use std::io::Read;
    let mut s = stream;
    s.read(buf).map(|n| (n, None))
}

/// No error queue here: never a stamp.
pub(crate) fn read_tx_stamp(_fd: super::SockRef<'_>) -> io::Result<Option<(u32, u64)>> {
    Ok(None)
}

// Socket options a peer asks for on its data streams (`socket::DataOptions`). Not offered here:
// the caller refuses what it cannot honour rather than measure with the defaults.

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_tcp_mss(_sock: &socket2::Socket, _mss: u32) -> io::Result<()> {
    Err(unsupported())
}

/// `recv` with `MSG_TRUNC` discarding TCP data is Linux's: elsewhere this fails with a "not
/// supported on this platform" error ([`io::ErrorKind::Unsupported`]).
pub(crate) fn tcp_recv_discard(
    _stream: &std::net::TcpStream,
    _buf: &mut [u8],
) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "receiving without a copy (MSG_TRUNC, --skip-rx-copy) is not supported on this platform",
    ))
}

/// `SO_BINDTODEVICE` is Linux's: elsewhere this fails with a "not supported on this platform"
/// error ([`io::ErrorKind::Unsupported`]).
pub(crate) fn bind_device(_sock: &socket2::Socket, _device: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "binding a socket to a device (SO_BINDTODEVICE) is not supported on this platform",
    ))
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_tcp_congestion(_sock: &socket2::Socket, _name: &str) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn tcp_congestion(_sock: &socket2::Socket) -> io::Result<String> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_ip_tos(_sock: &socket2::Socket, _tos: u8) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_ipv6_tclass(_sock: &socket2::Socket, _tclass: u8) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_max_pacing_rate(
    _sock: &socket2::Socket,
    _bytes_per_second: u64,
) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn tcp_mss(_sock: &socket2::Socket) -> io::Result<u32> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn tos(_sock: &socket2::Socket, _ipv6: bool) -> io::Result<u8> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn set_dont_fragment(_sock: &socket2::Socket, _ipv6: bool) -> io::Result<()> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn dont_fragment(_sock: &socket2::Socket, _ipv6: bool) -> io::Result<bool> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn max_pacing_rate(_sock: &socket2::Socket) -> io::Result<u64> {
    Err(unsupported())
}

/// Not available portably: fails with [`io::ErrorKind::Unsupported`].
pub(crate) fn path_mtu(_fd: super::SockRef<'_>, _ipv6: bool) -> io::Result<u32> {
    Err(unsupported())
}

/// `sonde mtu`'s probe options (`IP_PMTUDISC_PROBE`, `IP_RECVERR`) are Linux's: fails with
/// [`io::ErrorKind::Unsupported`].
pub(crate) fn set_mtu_probing(_sock: &std::net::UdpSocket, _ipv6: bool) -> io::Result<()> {
    Err(unsupported())
}

/// No error queue here: nothing found.
pub(crate) fn udp_take_too_big(
    _sock: &std::net::UdpSocket,
    _f: impl FnMut(u32, Option<std::net::IpAddr>, &[u8]),
) -> io::Result<usize> {
    Ok(0)
}

/// `EMSGSIZE` is Linux's answer to a datagram over the path MTU; not recognised here.
pub(crate) fn message_too_long(_e: &io::Error) -> bool {
    false
}

/// No `net.ipv4.tcp_ecn` here.
pub(crate) fn tcp_ecn_sysctl() -> Option<u8> {
    None
}

/// No list of congestion controls here.
pub(crate) fn available_congestion() -> Option<String> {
    None
}

/// Waits at most `timeout` for `stream` to have something to read: a peek of one byte under a
/// read timeout. True when it has.
pub(crate) fn wait_readable(stream: &TcpStream, timeout: std::time::Duration) -> io::Result<bool> {
    stream.set_read_timeout(Some(timeout.max(std::time::Duration::from_millis(1))))?;
    let r = stream.peek(&mut [0u8; 1]);
    stream.set_read_timeout(None)?;
    match r {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// What has arrived on `stream`, copied without being consumed and without waiting: the socket
/// made non-blocking for one `peek`, then blocking again.
pub(crate) fn peek_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    stream.set_nonblocking(true)?;
    let n = stream.peek(buf);
    stream.set_nonblocking(false)?;
    n
}

/// Makes the listener non-blocking: [`accept_with_wake`] then waits in short sleeps.
pub(crate) fn set_accept_wake(
    listener: &std::net::TcpListener,
    _wake: std::time::Duration,
) -> io::Result<()> {
    listener.set_nonblocking(true)
}

/// Polls a non-blocking listener every 5 ms for at most `wake`.
pub(crate) fn accept_with_wake(
    listener: &std::net::TcpListener,
    wake: std::time::Duration,
) -> io::Result<TcpStream> {
    let deadline = std::time::Instant::now() + wake;
    loop {
        match listener.accept() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return Err(e);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r => return r.map(|(s, _)| s),
        }
    }
}

/// `EMFILE` and `ENFILE` as most Unix systems number them; Windows' `WSAEMFILE`.
pub(crate) fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24 | 10024))
}

/// Not done here (no `unsafe` in this module).
pub(crate) fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    Err(unsupported())
}

/// No system-wide counters here (macOS has no interface to them that sonde uses).
pub(crate) fn system_activity() -> crate::cpu::SystemActivity {
    crate::cpu::SystemActivity::default()
}

/// Not offered here (no `unsafe` in this module): CPU affinity is Linux's.
pub(crate) fn allowed_cpus() -> io::Result<Vec<u32>> {
    Err(unsupported())
}

/// Not offered here: CPU affinity is Linux's.
pub(crate) fn set_thread_cpus(_cpus: &[u32]) -> io::Result<()> {
    Err(unsupported())
}

/// No `SO_BUSY_POLL` outside Linux.
pub(crate) fn set_busy_poll(_fd: super::SockRef<'_>, _usecs: u32) -> io::Result<()> {
    Err(unsupported())
}

/// No `UDP_GRO` outside Linux.
pub(crate) fn enable_udp_gro(_sock: &UdpSocket) -> io::Result<()> {
    Err(unsupported())
}

/// The zero-copy sends of `-Z` (`SO_ZEROCOPY`, `MSG_ZEROCOPY`) are Linux's.
fn zerocopy_unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "zero-copy sends (SO_ZEROCOPY, MSG_ZEROCOPY, -Z/--zerocopy) are not supported on this \
         platform",
    )
}

/// `SO_ZEROCOPY` is Linux's: elsewhere this fails with a "not supported on this platform"
/// error.
pub(crate) fn set_zerocopy(_sock: &socket2::Socket) -> io::Result<()> {
    Err(zerocopy_unsupported())
}

/// See [`set_zerocopy`].
pub(crate) fn zerocopy(_sock: &socket2::Socket) -> io::Result<bool> {
    Err(zerocopy_unsupported())
}

/// A zero-copy completion (never produced here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZerocopyDone {
    pub(crate) first: u32,
    pub(crate) last: u32,
    pub(crate) copied: bool,
}

/// See [`set_zerocopy`].
pub(crate) fn send_zerocopy(_stream: &std::net::TcpStream, _buf: &[u8]) -> io::Result<usize> {
    Err(zerocopy_unsupported())
}

/// See [`set_zerocopy`].
pub(crate) fn read_zerocopy_done(
    _stream: &std::net::TcpStream,
) -> io::Result<Option<ZerocopyDone>> {
    Err(zerocopy_unsupported())
}

/// See [`set_zerocopy`].
pub(crate) fn wait_error_queue(
    _stream: &std::net::TcpStream,
    _timeout: std::time::Duration,
) -> io::Result<bool> {
    Err(zerocopy_unsupported())
}

/// The TOS byte of received datagrams (`IP_RECVTOS`) is read on Linux only: elsewhere this fails
/// with a "not supported on this platform" error and `--ecn`'s receivers do not count marks.
pub(crate) fn enable_recv_tos(_sock: &UdpSocket) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "reading received datagrams' ECN bits (IP_RECVTOS) is not supported on this platform",
    ))
}

/// The readiness loop of many-flow latency tests: not on this platform (epoll is Linux's).
pub(crate) struct Poller;

/// Whether this platform has [`Poller`].
pub(crate) const POLLER: bool = false;

// The methods keep Linux's signatures so that the callers compile alike; `new` fails, so none
// of them is ever called on a value.
#[expect(
    clippy::unused_self,
    reason = "the same methods as the Linux poller's, never called: new() fails"
)]
impl Poller {
    /// Fails: [`io::ErrorKind::Unsupported`].
    pub(crate) fn new(_capacity: usize) -> io::Result<Self> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "many flows or requests in flight (-P, --depth, --response-size) are not supported on \
             this platform (their readiness loop is epoll, Linux)",
        ))
    }

    pub(crate) fn add(&self, _fd: super::SockRef<'_>, _token: u64, _write: bool) -> io::Result<()> {
        Ok(())
    }

    pub(crate) fn modify(
        &self,
        _fd: super::SockRef<'_>,
        _token: u64,
        _write: bool,
    ) -> io::Result<()> {
        Ok(())
    }

    pub(crate) fn remove(&self, _fd: super::SockRef<'_>) -> io::Result<()> {
        Ok(())
    }

    pub(crate) fn wait(&mut self, _timeout: std::time::Duration) -> io::Result<usize> {
        Ok(0)
    }

    pub(crate) fn event(&self, _i: usize) -> (u64, bool, bool) {
        (0, false, false)
    }
}
