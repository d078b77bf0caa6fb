//! Linux: UDP GSO (`UDP_SEGMENT`, Linux 4.18), `sendmmsg`/`recvmmsg` and `TCP_INFO`.
//!
//! Every `unsafe` block here is a system call on a file descriptor borrowed from a live std
//! socket, with pointers into buffers that outlive the call.

use std::io;
use std::mem;
use std::net::{TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr;
use std::time::Duration;

use socket2::Socket;

mod cmsg;

use cmsg::{Cmsg, Encoder, SO_TIMESTAMPING};

/// Most datagrams in one GSO send. The kernel's `UDP_MAX_SEGMENTS` was 64 from Linux 4.18 and
/// was later raised to 128; 64 works everywhere and already amortises the system call.
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;

/// Most payload bytes in one GSO send: the 65,535-byte IPv4 total length minus the IPv4 (20)
/// and UDP (8) headers. IPv6 allows 20 bytes more; one bound for both keeps it simple.
pub(crate) const MAX_GSO_BYTES: usize = 65_507;

/// Most datagrams in one `sendmmsg`/`recvmmsg` call (`UIO_MAXIOV`).
const MAX_BATCH: usize = 1024;

/// Sends `buf` as one UDP GSO super-datagram: the kernel cuts it into datagrams of `segment`
/// bytes (the last one may be shorter). Returns the bytes taken: for UDP the kernel takes the
/// whole buffer or fails.
pub(crate) fn send_segments(sock: &UdpSocket, buf: &[u8], segment: u16) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    };
    // Room for one cmsghdr carrying a u16 (CMSG_SPACE(2) is 24 bytes on 64-bit targets, 16 on
    // 32-bit ones).
    let mut control: cmsg::Buf<4> = [0; 4];

    // SAFETY: msghdr is a C struct of integers and raw pointers; all zeroes is a valid value
    // (no name, no iovecs, no control data).
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut enc = Encoder::new(&mut msg, &mut control);
    enc.push(libc::SOL_UDP, libc::UDP_SEGMENT, segment);
    enc.finish();

    // SAFETY: the descriptor belongs to `sock`, borrowed for the call; `msg` points at `iov`
    // (covering exactly `buf`) and `control`, all alive until sendmsg returns; the kernel only
    // reads through them.
    let sent = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

/// True when a [`send_segments`] error means "no GSO for this socket or route" rather than a
/// fault of the network: no `UDP_SEGMENT` (`ENOPROTOOPT`), a segment larger than the route's
/// MTU (`EINVAL`), no checksum offload on the device (`EIO`), or a super-datagram the path
/// cannot take (`EMSGSIZE`). The caller then sends datagram by datagram.
pub(crate) fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// True when `sendmmsg`/`recvmmsg` do not exist here (`ENOSYS`, e.g. some sandboxes).
pub(crate) fn batch_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSYS)
}

/// A UDP socket's report of an ICMP port unreachable for an earlier datagram (`ECONNREFUSED`).
pub(crate) fn port_unreachable(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionRefused
}

/// True for `ENOBUFS`: a full device queue or qdisc dropped the datagram. Worth retrying.
pub(crate) fn no_buffer_space(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOBUFS)
}

/// Reusable `mmsghdr`/`iovec` vectors for `sendmmsg` and `recvmmsg` over a caller's buffer cut
/// into equal slots. Allocated once, before a loop; each call only rewrites the pointers.
pub(crate) struct Batch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    /// Cleared when `recvmmsg` turned out not to exist; `recv` then reads one datagram a call.
    recvmmsg: bool,
    /// [`Batch::with_segments`]: a control buffer per header for the `UDP_GRO` segment size
    /// (`u64`s, so that the kernel's `cmsghdr` is aligned); empty otherwise.
    control: Vec<u64>,
}

/// `u64`s of control buffer per header: room for one `UDP_GRO` cmsg (`CMSG_SPACE(4)`, 24
/// bytes), one `IP_TOS` or `IPV6_TCLASS` cmsg (24 bytes) and a spare.
const CONTROL_WORDS: usize = 8;

impl Batch {
    /// Vectors for up to `capacity` datagrams a call (at least 1, at most `UIO_MAXIOV`).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, MAX_BATCH);
        Self {
            // SAFETY: mmsghdr and iovec are C structs of integers and raw pointers; all zeroes
            // is a valid value of each (null pointers, zero lengths).
            hdrs: (0..capacity).map(|_| unsafe { mem::zeroed() }).collect(),
            // SAFETY: as above.
            iovs: (0..capacity).map(|_| unsafe { mem::zeroed() }).collect(),
            recvmmsg: true,
            control: Vec::new(),
        }
    }

    /// [`Batch::new`] for a socket with `UDP_GRO` on ([`enable_udp_gro`]): each received
    /// buffer may hold several datagrams of [`Batch::segment_size`] bytes (the last may be
    /// shorter).
    pub(crate) fn with_segments(capacity: usize) -> Self {
        let mut b = Self::new(capacity);
        b.control = vec![0; b.hdrs.len() * CONTROL_WORDS];
        b
    }

    /// The segment size of buffer `i` of the last [`Batch::recv`]: the size of each datagram
    /// the kernel coalesced into it (`UDP_GRO` cmsg), or `None` for a single datagram.
    pub(crate) fn segment_size(&self, i: usize) -> Option<usize> {
        if self.control.is_empty() {
            return None;
        }
        let hdr = &self.hdrs[i].msg_hdr;
        // SAFETY: `hdr` was filled by the last recvmmsg: its `msg_control` points at this
        // header's part of `self.control` (alive, aligned, not borrowed mutably while the
        // iterator lives) and `msg_controllen` is what the kernel wrote there.
        let mut found = unsafe { cmsg::Iter::new(hdr) };
        found.find_map(|c| match c {
            Cmsg::GroSegment(size) => Some(usize::try_from(size).ok().filter(|&s| s > 0)),
            _ => None,
        })?
    }

    /// The TOS byte (or IPv6 traffic class) buffer `i` of the last [`Batch::recv`] arrived
    /// with, on a socket with [`enable_recv_tos`] and a [`Batch::with_segments`] batch (every
    /// datagram of a coalesced buffer has the same: GRO merges only equal ones).
    pub(crate) fn tos(&self, i: usize) -> Option<u8> {
        if self.control.is_empty() {
            return None;
        }
        let hdr = &self.hdrs[i].msg_hdr;
        // SAFETY: as in `segment_size`.
        let mut found = unsafe { cmsg::Iter::new(hdr) };
        found.find_map(|c| match c {
            Cmsg::Tos(tos) => Some(tos),
            _ => None,
        })
    }

    /// Datagrams per call.
    pub(crate) fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Sends the consecutive `size`-byte datagrams of `buf` (as many as fit, up to
    /// [`Batch::capacity`]) with one `sendmmsg`. Returns how many the kernel took, which may be
    /// fewer than offered.
    pub(crate) fn send(&mut self, sock: &UdpSocket, buf: &[u8], size: usize) -> io::Result<usize> {
        let n = self.slots(buf.len(), size);
        if n == 0 {
            return Ok(0);
        }
        self.point(buf.as_ptr().cast_mut(), size, n);
        // SAFETY: the descriptor belongs to `sock`, borrowed for the call. The first `n` headers
        // each point at one iovec of `self.iovs`, which covers `size` bytes inside `buf`
        // (n * size <= buf.len()); sendmmsg only reads the data and writes `msg_len` of those
        // headers. Everything outlives the call.
        let sent = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                0,
            )
        };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    /// Receives into consecutive `size`-byte slots of `buf` (as many as fit, up to
    /// [`Batch::capacity`]) with one `recvmmsg(MSG_WAITFORONE)`: blocks, for at most the
    /// socket's `SO_RCVTIMEO`, for the first datagram only, then takes what is already queued.
    /// Returns the number of datagrams; [`Batch::datagram_len`] gives their lengths. A datagram
    /// longer than its slot is truncated to it.
    pub(crate) fn recv(
        &mut self,
        sock: &UdpSocket,
        buf: &mut [u8],
        size: usize,
    ) -> io::Result<usize> {
        let n = self.slots(buf.len(), size);
        if n == 0 {
            return Ok(0);
        }
        if !self.recvmmsg {
            return self.recv_one(sock, &mut buf[..size]);
        }
        self.point(buf.as_mut_ptr(), size, n);
        // SAFETY: the descriptor belongs to `sock`, borrowed for the call. The first `n` headers
        // each point at one iovec of `self.iovs`, which covers a distinct `size`-byte slot of
        // `buf` (n * size <= buf.len()), borrowed mutably for the call; the kernel writes at most
        // `size` bytes into each slot and `msg_len`/`msg_flags` of those headers. No name is
        // given; a control buffer only with `with_segments`, each header's own
        // CONTROL_WORDS-word part of `self.control`, whose length `msg_controllen` states. A
        // null timeout is allowed (SO_RCVTIMEO bounds the wait).
        let got = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                // glibc declares the flags `c_int`, musl `c_uint`: the static build's target.
                libc::MSG_WAITFORONE as _,
                ptr::null_mut(),
            )
        };
        match usize::try_from(got) {
            Ok(got) => Ok(got),
            Err(_) => {
                let e = io::Error::last_os_error();
                if batch_unsupported(&e) {
                    self.recvmmsg = false;
                    return self.recv_one(sock, &mut buf[..size]);
                }
                Err(e)
            }
        }
    }

    /// Bytes of datagram `i` of the last [`Batch::recv`] (at most its slot size).
    pub(crate) fn datagram_len(&self, i: usize) -> usize {
        self.hdrs[i].msg_len as usize
    }

    fn recv_one(&mut self, sock: &UdpSocket, slot: &mut [u8]) -> io::Result<usize> {
        let len = sock.recv(slot)?;
        self.hdrs[0].msg_len = len as libc::c_uint;
        Ok(1)
    }

    /// How many `size`-byte slots of a `len`-byte buffer one call uses.
    fn slots(&self, len: usize, size: usize) -> usize {
        len.checked_div(size)
            .map_or(0, |slots| slots.min(self.hdrs.len()))
    }

    /// Points header `i < n` at iovec `i`, and iovec `i` at `base + i * size`, `size` bytes.
    fn point(&mut self, base: *mut u8, size: usize, n: usize) {
        for (i, iov) in self.iovs.iter_mut().take(n).enumerate() {
            iov.iov_base = base.wrapping_add(i * size).cast();
            iov.iov_len = size;
        }
        // Taken after the iovecs were written, so no later borrow of them invalidates it.
        let iovs = self.iovs.as_mut_ptr();
        let control = self.control.as_mut_ptr();
        let segments = !self.control.is_empty();
        for (i, hdr) in self.hdrs.iter_mut().take(n).enumerate() {
            hdr.msg_hdr.msg_name = ptr::null_mut();
            hdr.msg_hdr.msg_namelen = 0;
            hdr.msg_hdr.msg_iov = iovs.wrapping_add(i);
            hdr.msg_hdr.msg_iovlen = 1;
            if segments {
                hdr.msg_hdr.msg_control = control.wrapping_add(i * CONTROL_WORDS).cast();
                // `size_t` in glibc, `socklen_t` in musl (the static build's target): a few
                // words either way.
                hdr.msg_hdr.msg_controllen = (CONTROL_WORDS * mem::size_of::<u64>()) as _;
            } else {
                hdr.msg_hdr.msg_control = ptr::null_mut();
                hdr.msg_hdr.msg_controllen = 0;
            }
            hdr.msg_hdr.msg_flags = 0;
            hdr.msg_len = 0;
        }
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("capacity", &self.hdrs.len())
            .field("recvmmsg", &self.recvmmsg)
            .finish()
    }
}

/// `tcpi_total_retrans` of `TCP_INFO`; `None` if the kernel's `tcp_info` is too short to hold
/// it or the call fails (not a TCP socket).
pub(crate) fn tcp_total_retrans(stream: &TcpStream) -> Option<u64> {
    const AT: usize = mem::offset_of!(libc::tcp_info, tcpi_total_retrans);
    let mut buf = [0u8; mem::size_of::<libc::tcp_info>()];
    let len = tcp_info_bytes(stream, &mut buf).ok()?;
    let field = buf.get(AT..AT + 4).filter(|_| len >= AT + 4)?;
    Some(u64::from(u32::from_ne_bytes(field.try_into().ok()?)))
}

// CPU cost, the whole of TCP_INFO, and interface facts (ethtool, getifaddrs), for issue 4. Kept
// above the tests so that module stays last.

/// The host's interrupts and context switches since boot, from `/proc/stat` (proc(5): the
/// first number of `intr` is the total of all interrupts, `ctxt` the context switches). Linux
/// counts no system calls host-wide (that takes tracing), so `syscalls` is `None`; so is a
/// figure `/proc` does not give (no `/proc` in a container's empty root).
pub(crate) fn system_activity() -> crate::cpu::SystemActivity {
    std::fs::read_to_string("/proc/stat")
        .map(|stat| proc_stat_activity(&stat))
        .unwrap_or_default()
}

/// [`system_activity`]'s parse of `/proc/stat`'s text.
fn proc_stat_activity(stat: &str) -> crate::cpu::SystemActivity {
    let first = |key: &str| {
        stat.lines().find_map(|line| {
            let mut words = line.split_ascii_whitespace();
            (words.next() == Some(key)).then(|| words.next()?.parse().ok())?
        })
    };
    // The `cpu` line: user nice system idle iowait irq softirq ..., in clock ticks.
    let softirq_ticks: Option<u64> = stat.lines().find_map(|line| {
        let mut words = line.split_ascii_whitespace();
        (words.next() == Some("cpu")).then(|| words.nth(6)?.parse().ok())?
    });
    crate::cpu::SystemActivity {
        interrupts: first("intr"),
        context_switches: first("ctxt"),
        syscalls: None,
        softirq_ns: softirq_ticks
            .zip(clock_ticks_per_second())
            .map(|(t, hz)| t.saturating_mul(1_000_000_000) / hz),
    }
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc/stat`'s times (USER_HZ, 100 almost everywhere).
fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf takes a name and returns a value; it touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0)
}

/// `getrusage` for the whole process, or with `thread` for the calling thread only
/// (`RUSAGE_THREAD`, Linux 2.6.26).
pub(crate) fn rusage(thread: bool) -> io::Result<crate::cpu::CpuSnapshot> {
    let who = if thread {
        libc::RUSAGE_THREAD
    } else {
        libc::RUSAGE_SELF
    };
    // SAFETY: rusage is a C struct of integers; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage that outlives the call.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let time = |tv: libc::timeval| {
        std::time::Duration::from_secs(u64::try_from(tv.tv_sec).unwrap_or(0))
            + std::time::Duration::from_micros(u64::try_from(tv.tv_usec).unwrap_or(0))
    };
    Ok(crate::cpu::CpuSnapshot {
        user: time(usage.ru_utime),
        system: time(usage.ru_stime),
        voluntary_switches: u64::try_from(usage.ru_nvcsw).ok(),
        involuntary_switches: u64::try_from(usage.ru_nivcsw).ok(),
    })
}

/// Reads `TCP_INFO` into `buf` as the kernel lays it out and returns how many bytes the kernel
/// wrote: older kernels write a shorter `struct tcp_info`, and the caller reads only what is
/// there.
pub(crate) fn tcp_info_bytes(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    getsockopt(stream.as_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, buf)
}

/// ethtool commands (`linux/ethtool.h`). The legacy per-offload "get" commands are used rather
/// than `ETHTOOL_GFEATURES`, whose bits only mean something after a string-set lookup; the
/// kernel still answers them from the same feature flags, and without `CAP_NET_ADMIN`.
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const ETHTOOL_GRXCSUM: u32 = 0x0000_0014;
const ETHTOOL_GTXCSUM: u32 = 0x0000_0016;
const ETHTOOL_GTSO: u32 = 0x0000_001e;
const ETHTOOL_GGSO: u32 = 0x0000_0023;
const ETHTOOL_GFLAGS: u32 = 0x0000_0025;
const ETHTOOL_GGRO: u32 = 0x0000_002b;
const ETHTOOL_GSTRINGS: u32 = 0x0000_001b;
const ETHTOOL_GSTATS: u32 = 0x0000_001d;
/// The string set of `ETHTOOL_GSTATS`'s names (`enum ethtool_stringset`).
const ETH_SS_STATS: u32 = 1;
/// The length of one name in `ETHTOOL_GSTRINGS`' answer, NUL padded.
const ETH_GSTRING_LEN: usize = 32;
/// The most driver statistics read: a large NIC has a few thousand (per-queue counters).
const MAX_DRIVER_STATS: u32 = 16_384;
/// The LRO bit of `ETHTOOL_GFLAGS` (`ETH_FLAG_LRO`).
const ETH_FLAG_LRO: u32 = 1 << 15;

/// `struct ethtool_value`.
#[repr(C)]
// `cmd` is only read by the kernel.
#[allow(dead_code)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ethtool_drvinfo`: the kernel copies exactly its 196 bytes.
#[repr(C)]
// Only `driver` is read here; the rest is room for what the kernel writes.
#[allow(dead_code)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}
const _: () = assert!(mem::size_of::<EthtoolDrvinfo>() == 196);

/// A datagram socket to hang `SIOCETHTOOL` on (any family does; IPv6-only hosts exist).
fn ioctl_socket() -> io::Result<socket2::Socket> {
    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)
        .or_else(|_| socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None))
}

/// `SIOCETHTOOL` on `interface` with the command structure at `data`.
///
/// # Safety
///
/// `data` must point at a live, writable ethtool command structure of the size the kernel
/// expects for its `cmd`.
unsafe fn ethtool(
    sock: &socket2::Socket,
    interface: &str,
    data: *mut libc::c_void,
) -> io::Result<()> {
    // The name and its NUL must fit IFNAMSIZ; a name with a NUL would name another interface.
    if interface.len() >= libc::IFNAMSIZ || interface.as_bytes().contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: ifreq is a C struct of a byte array and a union of integers and pointers; all
    // zeroes is a valid value (an empty name, null data).
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(interface.as_bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_data = data.cast();
    // SAFETY: the descriptor belongs to `sock`, borrowed for the call; `req` is a valid ifreq
    // with a NUL-terminated name whose data pointer the caller vouches for.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One legacy ethtool "get" command's value.
fn ethtool_value(sock: &socket2::Socket, interface: &str, cmd: u32) -> io::Result<u32> {
    let mut value = EthtoolValue { cmd, data: 0 };
    // SAFETY: every command passed here takes a `struct ethtool_value`, which `value` is.
    unsafe { ethtool(sock, interface, ptr::addr_of_mut!(value).cast())? };
    Ok(value.data)
}

/// The offloads switched on for `interface`; each one the kernel will not say is `None`.
pub(crate) fn nic_offloads(interface: &str) -> sonde_wire::NicOffloads {
    let Ok(sock) = ioctl_socket() else {
        return sonde_wire::NicOffloads::default();
    };
    let on = |cmd| ethtool_value(&sock, interface, cmd).ok().map(|v| v != 0);
    sonde_wire::NicOffloads {
        gso: on(ETHTOOL_GGSO),
        gro: on(ETHTOOL_GGRO),
        tso: on(ETHTOOL_GTSO),
        lro: ethtool_value(&sock, interface, ETHTOOL_GFLAGS)
            .ok()
            .map(|flags| flags & ETH_FLAG_LRO != 0),
        rx_checksum: on(ETHTOOL_GRXCSUM),
        tx_checksum: on(ETHTOOL_GTXCSUM),
    }
}

/// The driver ethtool names for `interface` (virtual devices such as `veth` have one though
/// they have no `device/driver` in sysfs); `None` where there is none (`lo`).
pub(crate) fn nic_driver(interface: &str) -> Option<String> {
    let sock = ioctl_socket().ok()?;
    // SAFETY: EthtoolDrvinfo is a C struct of integers and byte arrays; all zeroes is valid.
    let mut info: EthtoolDrvinfo = unsafe { mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: ETHTOOL_GDRVINFO takes a `struct ethtool_drvinfo`, which `info` is, all 196 bytes.
    unsafe { ethtool(&sock, interface, ptr::addr_of_mut!(info).cast()) }.ok()?;
    let name = info.driver.split(|&b| b == 0).next().unwrap_or_default();
    let name = String::from_utf8_lossy(name).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// The driver's own statistics of `interface`, what `ethtool -S` prints: each name with its
/// value (`ETHTOOL_GDRVINFO` for the count, `ETHTOOL_GSTRINGS` for the names, `ETHTOOL_GSTATS`
/// for the values). Empty for a driver without any; an error where the interface has no
/// ethtool support (`lo`).
pub(crate) fn driver_stats(interface: &str) -> io::Result<Vec<(String, u64)>> {
    let sock = ioctl_socket()?;
    // SAFETY: EthtoolDrvinfo is a C struct of integers and byte arrays; all zeroes is valid.
    let mut info: EthtoolDrvinfo = unsafe { mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: ETHTOOL_GDRVINFO takes a `struct ethtool_drvinfo`, which `info` is, all 196 bytes.
    unsafe { ethtool(&sock, interface, ptr::addr_of_mut!(info).cast())? };
    let n = info.n_stats;
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > MAX_DRIVER_STATS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the driver counts {n} statistics, more than {MAX_DRIVER_STATS}"),
        ));
    }
    // The kernel answers with as many as the driver counts when asked, which a reconfiguration
    // between these calls could raise (ethtool(8) makes the same calls): both buffers hold
    // twice the count read, and an answer longer than that is refused.
    let room = n.saturating_mul(2);
    let slots = usize::try_from(room).unwrap_or(usize::MAX);
    // `struct ethtool_gstrings`: cmd, string_set, len, then `len` names of ETH_GSTRING_LEN bytes;
    // held in u32 words for the header's alignment.
    let mut strings = vec![0u32; 3 + slots * ETH_GSTRING_LEN / 4];
    strings[..3].copy_from_slice(&[ETHTOOL_GSTRINGS, ETH_SS_STATS, n]);
    // SAFETY: `strings` is a writable `struct ethtool_gstrings` with room for `room` names,
    // twice what the driver counted just before.
    unsafe { ethtool(&sock, interface, strings.as_mut_ptr().cast())? };
    let names = strings[2];
    // `struct ethtool_stats`: cmd, n_stats, then `n_stats` u64 values; the header is one u64.
    let mut stats = vec![0u64; 1 + slots];
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
    header[4..].copy_from_slice(&n.to_ne_bytes());
    stats[0] = u64::from_ne_bytes(header);
    // SAFETY: `stats` is a writable `struct ethtool_stats` with room for `room` values.
    unsafe { ethtool(&sock, interface, stats.as_mut_ptr().cast())? };
    let values = {
        let h = stats[0].to_ne_bytes();
        u32::from_ne_bytes([h[4], h[5], h[6], h[7]])
    };
    if names > room || values > room || names != values {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the driver's statistics changed while read ({n}, then {names} names and {values} values)"),
        ));
    }
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes
        .chunks(ETH_GSTRING_LEN)
        .zip(&stats[1..])
        .take(usize::try_from(names).unwrap_or(0))
        .map(|(name, &value)| {
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            (String::from_utf8_lossy(name).into_owned(), value)
        })
        .collect())
}

/// Every IPv4 and IPv6 address of every interface, with the interface's name (`getifaddrs`).
pub(crate) fn interface_addresses() -> io::Result<Vec<(String, std::net::IpAddr)>> {
    let mut head: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: `head` is a valid place for the list pointer; on success the list is ours until
    // freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a non-null node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*cursor };
        cursor = node.ifa_next;
        if node.ifa_addr.is_null() || node.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says which
        // sockaddr_* it is; reads are unaligned-safe copies of the whole structure.
        let addr = unsafe {
            match i32::from((*node.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = ptr::read_unaligned(node.ifa_addr.cast::<libc::sockaddr_in>());
                    // s_addr holds the address in network order, i.e. its bytes in memory.
                    std::net::IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = ptr::read_unaligned(node.ifa_addr.cast::<libc::sockaddr_in6>());
                    std::net::IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            }
        };
        // SAFETY: ifa_name is a non-null, NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(node.ifa_name) };
        found.push((name.to_string_lossy().into_owned(), addr));
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once; no reference into the
    // list outlives this point (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

// Kernel timestamps (`SO_TIMESTAMPING`) and the host's monotonic clock, for latency's inner
// view (`--timestamps`, `--one-way`). Kept above the tests as well.

/// `SCM_TSTAMP_SND` (`linux/errqueue.h`): the stamp was taken as the packet left for the device.
const SCM_TSTAMP_SND: u32 = 0;

/// Room for the control messages of one receive: `SCM_TIMESTAMPING` (three `timespec`s) and an
/// `IP(V6)_RECVERR` (`sock_extended_err` and an address), with their headers.
type ControlBuf = cmsg::Buf<48>;

/// `CLOCK_MONOTONIC` now, ns: the clock `std::time::Instant` reads, here with its origin (the
/// host's boot), so that two processes on one host read the same clock.
pub(crate) fn monotonic_ns() -> u64 {
    // SAFETY: timespec is a C struct of integers; all zeroes is a valid value.
    let mut ts: libc::timespec = unsafe { mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        // CLOCK_MONOTONIC cannot fail on Linux; keep a value that does not go backwards.
        return 0;
    }
    timespec_ns(&ts).unwrap_or(0)
}

fn timespec_ns(ts: &libc::timespec) -> Option<u64> {
    let s = u64::try_from(ts.tv_sec).ok()?;
    let ns = u64::try_from(ts.tv_nsec).ok()?;
    s.checked_mul(1_000_000_000)?.checked_add(ns)
}

fn set_timestamping(fd: BorrowedFd<'_>, flags: libc::c_uint) -> io::Result<()> {
    if SO_TIMESTAMPING < 0 {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    setsockopt(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, flags)
}

/// Asks the kernel for software receive timestamps on `sock` and, with `tx`, software transmit
/// timestamps on its error queue, keyed by a per-datagram counter from 0 (`OPT_ID`) and without
/// a copy of the datagram (`OPT_TSONLY`).
pub(crate) fn udp_enable_timestamps(sock: &UdpSocket, tx: bool) -> io::Result<()> {
    let mut flags = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    if tx {
        flags |= libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    }
    set_timestamping(sock.as_fd(), flags)
}

/// Asks the kernel for software receive timestamps on `stream` (the stamp of the last segment
/// a read takes) and, with `tx`, software transmit timestamps on its error queue, keyed by the
/// offset of the last byte of each write from the first byte written after this call
/// (`OPT_ID`), without a copy of the data (`OPT_TSONLY`).
pub(crate) fn tcp_enable_timestamps(stream: &TcpStream, tx: bool) -> io::Result<()> {
    let mut flags = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    if tx {
        flags |= libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    }
    set_timestamping(stream.as_fd(), flags)
}

/// Turns timestamps off again (best effort: the socket may be closing).
pub(crate) fn disable_timestamps(fd: BorrowedFd<'_>) {
    let _ = set_timestamping(fd, 0);
}

/// What one `recvmsg` found in its control messages.
#[derive(Debug, Default, Clone, Copy)]
struct Found {
    /// The software timestamp of `SCM_TIMESTAMPING`, ns of `CLOCK_REALTIME`.
    software_ns: Option<u64>,
    /// An `IP(V6)_RECVERR` of timestamping origin: `(ee_info, ee_data)`.
    stamp_key: Option<(u32, u32)>,
    /// An `IP(V6)_RECVERR` of zero-copy origin: the range of send calls it completes.
    zerocopy: Option<ZerocopyDone>,
    /// An `IP(V6)_RECVERR` saying a datagram was too big: the MTU named (`ee_info`) and the
    /// router that named it (none for this host's own refusal).
    too_big: Option<(u32, Option<std::net::IpAddr>)>,
}

/// One `recvmsg` into `buf` with a control buffer; `flags` as recvmsg's. Returns the bytes
/// received and what the control messages said.
fn recvmsg_with_control(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, Found)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control: ControlBuf = [0; 48];
    // SAFETY: msghdr is a C struct of integers and raw pointers; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = mem::size_of_val(&control) as _;
    // SAFETY: the descriptor is borrowed from a live socket for the call; `msg` points at one
    // iovec covering exactly `buf` (borrowed mutably) and at `control`, both alive until the
    // call returns; the kernel writes at most their lengths and updates the lengths in `msg`.
    let got = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    let n = usize::try_from(got).map_err(|_| io::Error::last_os_error())?;
    let mut found = Found::default();
    // SAFETY: `msg` was filled by a successful recvmsg: its control pointer and (updated)
    // length describe initialised bytes inside `control`, which is not written while the
    // iterator lives.
    for c in unsafe { cmsg::Iter::new(&msg) } {
        match c {
            Cmsg::Timestamping(ts) => found.software_ns = timespec_ns(&ts[0]).filter(|&ns| ns != 0),
            Cmsg::RecvErr(err, _)
                if err.ee_errno == libc::ENOMSG as u32
                    && err.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING =>
            {
                found.stamp_key = Some((err.ee_info, err.ee_data));
            }
            Cmsg::RecvErr(err, _)
                if err.ee_errno == 0 && err.ee_origin == SO_EE_ORIGIN_ZEROCOPY =>
            {
                found.zerocopy = Some(ZerocopyDone {
                    first: err.ee_info,
                    last: err.ee_data,
                    copied: err.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                });
            }
            Cmsg::RecvErr(err, by)
                if err.ee_errno == libc::EMSGSIZE as u32
                    && match err.ee_origin {
                        libc::SO_EE_ORIGIN_ICMP => {
                            err.ee_type == ICMP_DEST_UNREACH && err.ee_code == ICMP_FRAG_NEEDED
                        }
                        libc::SO_EE_ORIGIN_ICMP6 => err.ee_type == ICMPV6_PKT_TOOBIG,
                        libc::SO_EE_ORIGIN_LOCAL => true,
                        _ => false,
                    } =>
            {
                let by = by.filter(|_| err.ee_origin != libc::SO_EE_ORIGIN_LOCAL);
                found.too_big = Some((err.ee_info, by));
            }
            _ => {}
        }
    }
    Ok((n, found))
}

/// Receives one datagram with its kernel receive timestamp (ns of `CLOCK_REALTIME`), if the
/// kernel gave one. Blocks for at most the socket's read timeout, as `recv`.
pub(crate) fn udp_recv_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, Option<u64>)> {
    recvmsg_with_control(sock.as_fd(), buf, 0).map(|(n, f)| (n, f.software_ns))
}

/// Reads from a TCP stream with the kernel receive timestamp of the last segment read, as
/// [`udp_recv_stamped`].
pub(crate) fn tcp_recv_stamped(
    stream: &TcpStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<u64>)> {
    recvmsg_with_control(stream.as_fd(), buf, 0).map(|(n, f)| (n, f.software_ns))
}

/// Takes one transmit timestamp off the error queue of the socket `fd` without waiting: `(key,
/// ns of CLOCK_REALTIME)`, the key (mod 2^32) counting a UDP socket's datagrams from 0, or a TCP
/// socket's bytes up to the last of the write, from 0, since timestamps were enabled. `Ok(None)`
/// when the queue is empty. Error-queue entries that are not send timestamps are skipped.
pub(crate) fn read_tx_stamp(fd: BorrowedFd<'_>) -> io::Result<Option<(u32, u64)>> {
    let mut scratch = [0u8; 64];
    loop {
        match recvmsg_with_control(fd, &mut scratch, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) {
            Ok((
                _,
                Found {
                    software_ns: Some(ns),
                    stamp_key: Some((SCM_TSTAMP_SND, key)),
                    ..
                },
            )) => return Ok(Some((key, ns))),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `SO_ZEROCOPY` (`asm-generic/socket.h`: 60 on every architecture Linux Rust targets but
/// SPARC's, 0x3e).
#[cfg(not(target_arch = "sparc64"))]
const SO_ZEROCOPY: libc::c_int = 60;
#[cfg(target_arch = "sparc64")]
const SO_ZEROCOPY: libc::c_int = 0x3e;
/// The error-queue origin of zero-copy completions (`linux/errqueue.h`).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// A zero-copy completion's code when the kernel copied the data after all.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// `SO_ZEROCOPY` (Linux 4.14; msg_zerocopy.rst): lets sends with `MSG_ZEROCOPY` send from the
/// caller's pages. Without it the kernel ignores the flag (and sends no completions).
pub(crate) fn set_zerocopy(sock: &Socket) -> io::Result<()> {
    setsockopt(
        sock.as_fd(),
        libc::SOL_SOCKET,
        SO_ZEROCOPY,
        1 as libc::c_int,
    )
}

/// Whether `SO_ZEROCOPY` is set, as read back.
pub(crate) fn zerocopy(sock: &Socket) -> io::Result<bool> {
    let mut buf = [0u8; 4];
    getsockopt(sock.as_fd(), libc::SOL_SOCKET, SO_ZEROCOPY, &mut buf)?;
    Ok(libc::c_int::from_ne_bytes(buf) != 0)
}

/// One zero-copy completion: send calls `first..=last` (numbered from 0 per socket, mod 2^32)
/// are done with their pages; `copied` when the kernel copied them after all
/// (`SO_EE_CODE_ZEROCOPY_COPIED`: loopback, veth, a device without scatter-gather).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZerocopyDone {
    pub(crate) first: u32,
    pub(crate) last: u32,
    pub(crate) copied: bool,
}

/// One TCP `send` with `MSG_ZEROCOPY` (and `MSG_NOSIGNAL`, as std's `write`): the kernel holds
/// `buf`'s pages until the completion for this call comes (see [`read_zerocopy_done`]). Blocks
/// for at most the socket's send timeout.
pub(crate) fn send_zerocopy(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the descriptor is borrowed from `stream` for the call; `buf` is a readable region
    // of `buf.len()` bytes. The kernel pins its pages for the send beyond the call: the caller
    // does not write them until the completion for this call has been read.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_ZEROCOPY | libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Takes one zero-copy completion off the error queue of `stream` without waiting; `Ok(None)`
/// when the queue holds none. Other error-queue entries are skipped.
pub(crate) fn read_zerocopy_done(stream: &TcpStream) -> io::Result<Option<ZerocopyDone>> {
    let mut scratch = [0u8; 0];
    loop {
        match recvmsg_with_control(
            stream.as_fd(),
            &mut scratch,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
        ) {
            Ok((
                _,
                Found {
                    zerocopy: Some(done),
                    ..
                },
            )) => return Ok(Some(done)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Waits at most `timeout` for `stream`'s error queue (or a socket error) to be readable:
/// `poll(2)` with no events asked reports `POLLERR`.
pub(crate) fn wait_error_queue(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd on this frame, for a descriptor borrowed from `stream` for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        1.. => Ok(pfd.revents & libc::POLLERR != 0),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

// Socket options a peer asks for on its data streams (`socket::DataOptions`: iperf3's -M, -C,
// -S, --fq-rate). Kept above the tests as well.

/// `SO_RCVTIMEO` on a listener: Linux's `accept(2)` honours it (socket(7)) and fails with
/// `EAGAIN` when it passes.
pub(crate) fn set_accept_wake(listener: &std::net::TcpListener, wake: Duration) -> io::Result<()> {
    socket2::SockRef::from(listener).set_read_timeout(Some(wake))
}

/// A plain `accept`: the listener's `SO_RCVTIMEO` bounds the wait.
pub(crate) fn accept_with_wake(
    listener: &std::net::TcpListener,
    _wake: Duration,
) -> io::Result<TcpStream> {
    listener.accept().map(|(s, _)| s)
}

/// Waits at most `timeout` (rounded up to a millisecond) for `stream` to have something to read
/// (or its end, or an error): one `poll(2)`. True when it has.
pub(crate) fn wait_readable(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms =
        libc::c_int::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd on this frame, for a descriptor borrowed from `stream` for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        1.. => Ok(true),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// What has arrived on `stream`, copied without being consumed and without waiting: one
/// `recv(MSG_PEEK | MSG_DONTWAIT)` (recv(2)), whatever the socket's blocking mode.
pub(crate) fn peek_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the descriptor belongs to `stream`, borrowed for the call; `buf` is valid and
    // writable for `buf.len()` bytes until recv returns.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `EMFILE`, `ENFILE` (accept(2)), and `ENOBUFS`, `ENOMEM`: out of descriptors or socket memory.
pub(crate) fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Sets the soft `RLIMIT_NOFILE` to the hard one (getrlimit(2)); the limits now in force.
pub(crate) fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `rlimit` for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid `rlimit`; raising the soft limit up to the hard one needs
        // no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// `TCP_MAXSEG` (tcp(7)): the kernel refuses values outside 88..=32767 with `EINVAL`.
pub(crate) fn set_tcp_mss(sock: &Socket, mss: u32) -> io::Result<()> {
    sock.set_mss(mss)
}

/// `TCP_CONGESTION` (tcp(7)): `ENOENT` when the kernel has no such algorithm (and, for root,
/// no module of that name to load); `EPERM` when an unprivileged process asks for one outside
/// `net.ipv4.tcp_allowed_congestion_control`.
///
/// Only a name the kernel lists as available (`net.ipv4.tcp_available_congestion_control`) is
/// asked for: for any other, a root process's `TCP_CONGESTION` makes the kernel load a module
/// `tcp_<name>`, and the name comes from a client. Anything else fails with `ENOENT`, as an
/// unknown algorithm does.
/// One TCP read that discards up to `buf.len()` bytes without copying them (`recv` with
/// `MSG_TRUNC`, tcp(7): "the received data is discarded"), for `--skip-rx-copy`: the receiver
/// counts what arrived and the kernel spares the copy to user space. `buf` is never written;
/// it is the call's bound. Returns the bytes discarded (0 at the end of the stream).
pub(crate) fn tcp_recv_discard(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the descriptor is open for the duration of the borrow of `stream`, and `buf` is a
    // valid writable region of `buf.len()` bytes (which MSG_TRUNC leaves untouched for TCP).
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_TRUNC,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `SO_BINDTODEVICE`: the socket sends and receives only through interface `device` (`-B
/// ADDR%DEV`, `--bind-dev`). Unprivileged since Linux 5.7 for a socket not yet bound elsewhere.
pub(crate) fn bind_device(sock: &Socket, device: &str) -> io::Result<()> {
    sock.bind_device(Some(device.as_bytes()))
}

pub(crate) fn set_tcp_congestion(sock: &Socket, name: &str) -> io::Result<()> {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if !congestion_listed(&available, name) {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    sock.set_tcp_congestion(name.as_bytes())
}

/// Whether `name` is one of the whitespace-separated names of `available`.
pub(crate) fn congestion_listed(available: &str, name: &str) -> bool {
    available.split_whitespace().any(|n| n == name)
}

/// The congestion control a TCP socket uses (the kernel pads the name with NULs to
/// `TCP_CA_NAME_MAX`).
pub(crate) fn tcp_congestion(sock: &Socket) -> io::Result<String> {
    let raw = sock.tcp_congestion()?;
    let name = raw.split(|&b| b == 0).next().unwrap_or_default();
    Ok(String::from_utf8_lossy(name).into_owned())
}

/// `IP_TOS` (ip(7)), which also marks the IPv4 packets of an IPv6 socket talking to a
/// v4-mapped peer; TCP keeps its own ECN bits.
pub(crate) fn set_ip_tos(sock: &Socket, tos: u8) -> io::Result<()> {
    sock.set_tos(u32::from(tos))
}

/// `TCP_MAXSEG` as read back: on a connected socket, the MSS it sends with.
pub(crate) fn tcp_mss(sock: &Socket) -> io::Result<u32> {
    sock.mss()
}

/// The TOS byte as read back: `IPV6_TCLASS` with `ipv6`, else `IP_TOS`.
pub(crate) fn tos(sock: &Socket, ipv6: bool) -> io::Result<u8> {
    let t = if ipv6 { sock.tclass_v6()? } else { sock.tos()? };
    u8::try_from(t).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// `IPV6_TCLASS` (ipv6(7)).
pub(crate) fn set_ipv6_tclass(sock: &Socket, tclass: u8) -> io::Result<()> {
    sock.set_tclass_v6(u32::from(tclass))
}

/// `SO_MAX_PACING_RATE` (socket(7), Linux 3.13), bytes per second: on TCP it also turns on
/// the kernel's own pacing (Linux 4.13), so it holds without the `fq` qdisc; UDP is paced only
/// by `fq`. Rates that fit 32 bits go as the `unsigned int` every kernel takes; larger ones as
/// the 64-bit value Linux 4.20 and later read.
pub(crate) fn set_max_pacing_rate(sock: &Socket, bytes_per_second: u64) -> io::Result<()> {
    let fd = sock.as_fd();
    match u32::try_from(bytes_per_second) {
        // u32::MAX itself means "unlimited" to the kernel.
        Ok(rate) if rate != u32::MAX => {
            setsockopt(fd, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, rate)
        }
        _ => setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            bytes_per_second,
        ),
    }
}

/// `SO_MAX_PACING_RATE` as set (`u64::MAX` or `u32::MAX`: unlimited).
pub(crate) fn max_pacing_rate(sock: &Socket) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    let len = getsockopt(
        sock.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_MAX_PACING_RATE,
        &mut buf,
    )?;
    match len {
        8 => Ok(u64::from_ne_bytes(buf)),
        // Kernels before 4.20 answer with an unsigned int.
        4 => Ok(u64::from(u32::from_ne_bytes([
            buf[0], buf[1], buf[2], buf[3],
        ]))),
        _ => Err(io::Error::from(io::ErrorKind::InvalidData)),
    }
}

/// Don't fragment (ip(7), ipv6(7)): `IP_MTU_DISCOVER` = `IP_PMTUDISC_DO` for the IPv4 packets
/// (of an IPv4 socket, or of an IPv6 one with a v4-mapped peer), or `IPV6_MTU_DISCOVER` =
/// `IPV6_PMTUDISC_DO` and `IPV6_DONTFRAG` for IPv6: every datagram carries DF (IPv6 never
/// fragments in the network), and one larger than the path MTU fails with `EMSGSIZE`.
pub(crate) fn set_dont_fragment(sock: &Socket, ipv6: bool) -> io::Result<()> {
    let fd = sock.as_fd();
    if ipv6 {
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )?;
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_DONTFRAG,
            1 as libc::c_int,
        )
    } else {
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Whether the socket's datagrams leave with DF: its `IP_MTU_DISCOVER` (or
/// `IPV6_MTU_DISCOVER`) reads `PMTUDISC_DO` (or `PROBE`, which sets DF too).
pub(crate) fn dont_fragment(sock: &Socket, ipv6: bool) -> io::Result<bool> {
    let (level, name) = if ipv6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER)
    };
    let mut buf = [0u8; 4];
    getsockopt(sock.as_fd(), level, name, &mut buf)?;
    let mode = libc::c_int::from_ne_bytes(buf);
    Ok(if ipv6 {
        matches!(mode, libc::IPV6_PMTUDISC_DO | libc::IPV6_PMTUDISC_PROBE)
    } else {
        matches!(mode, libc::IP_PMTUDISC_DO | libc::IP_PMTUDISC_PROBE)
    })
}

/// The path MTU the kernel knows for a connected socket (`IP_MTU` / `IPV6_MTU`, ip(7)): what a
/// datagram refused with `EMSGSIZE` under DF had to fit.
pub(crate) fn path_mtu(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<u32> {
    let (level, name) = if ipv6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut buf = [0u8; 4];
    getsockopt(fd, level, name, &mut buf)?;
    Ok(u32::try_from(libc::c_int::from_ne_bytes(buf)).unwrap_or(0))
}

/// `EMSGSIZE`: a datagram larger than the socket allows (the path MTU, under DF).
pub(crate) fn message_too_long(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EMSGSIZE)
}

/// `sonde mtu`'s probes (ip(7), ipv6(7)): DF on every datagram without the kernel's cached path
/// MTU standing in the way (`IP_PMTUDISC_PROBE`: a probe larger than a path MTU learnt earlier
/// is sent anyway, so each search measures the path afresh; only the interface's MTU limits
/// it), and ICMP errors queued with their details (`IP_RECVERR`), so a router's "fragmentation
/// needed" names its MTU and itself. IPv6 never fragments in the network: `IPV6_DONTFRAG`
/// keeps this host from fragmenting too.
pub(crate) fn set_mtu_probing(sock: &UdpSocket, ipv6: bool) -> io::Result<()> {
    let fd = sock.as_fd();
    if ipv6 {
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_PROBE,
        )?;
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_DONTFRAG,
            1 as libc::c_int,
        )?;
        setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1 as libc::c_int)
    } else {
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_PROBE,
        )?;
        setsockopt(fd, libc::IPPROTO_IP, libc::IP_RECVERR, 1 as libc::c_int)
    }
}

/// ICMP "fragmentation needed" (type 3 code 4) and ICMPv6 "packet too big" (type 2).
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
const ICMPV6_PKT_TOOBIG: u8 = 2;

/// Takes the "too big" entries off a UDP socket's error queue (`MSG_ERRQUEUE`, without
/// blocking), calling `f(mtu, by, payload)` for each: the MTU named, the router that named it
/// (`None` for this host's own refusal), and the first bytes of the refused datagram's payload
/// as the ICMP quoted it (empty when it quoted none). Other entries are dropped. Returns how many
/// were found.
pub(crate) fn udp_take_too_big(
    sock: &UdpSocket,
    mut f: impl FnMut(u32, Option<std::net::IpAddr>, &[u8]),
) -> io::Result<usize> {
    let mut found = 0;
    let mut quoted = [0u8; 64];
    // Bounded: the queue holds at most a socket buffer of entries; 64 is plenty for one probe.
    for _ in 0..64 {
        let flags = libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT;
        let (n, got) = match recvmsg_with_control(sock.as_fd(), &mut quoted, flags) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(found),
            Err(e) => return Err(e),
        };
        if let Some((mtu, by)) = got.too_big {
            found += 1;
            f(mtu, by, &quoted[..n.min(quoted.len())]);
        }
    }
    Ok(found)
}

/// `net.ipv4.tcp_ecn` (0, 1 or 2; it also governs IPv6 TCP): TCP sets its packets' ECN bits
/// itself, whatever `IP_TOS` says.
pub(crate) fn tcp_ecn_sysctl() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_ecn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The congestion controls the kernel offers (`net.ipv4.tcp_available_congestion_control`).
pub(crate) fn available_congestion() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// An option value [`setsockopt`] passes as it is: a plain integer (no padding, every byte
/// initialised), so the kernel reads exactly `size_of::<Self>()` bytes of it.
trait OptValue: Copy {}
impl OptValue for libc::c_int {}
impl OptValue for u32 {}
impl OptValue for u64 {}

/// `setsockopt(2)` with an integer value: the one place this crate makes the call on Linux
/// (socket2 has no `SO_TIMESTAMPING`, `SO_MAX_PACING_RATE`, `UDP_GRO` or `SO_BUSY_POLL`).
fn setsockopt<T: OptValue>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    let len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed from a live socket for the call; the kernel reads `len` bytes
    // from `value`, a plain integer (`OptValue`) on this frame that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::from_ref(&value).cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt(2)` into `buf`: how many bytes the kernel wrote (an older kernel writes a
/// shorter struct; the caller reads only what is there). The one place this crate makes the
/// call on Linux.
fn getsockopt(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut len = libc::socklen_t::try_from(buf.len()).unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `fd` is borrowed from a live socket for the call; the kernel writes at most
    // `len` bytes (the length of `buf`, borrowed mutably) and the length it wrote into `len`. A
    // byte buffer needs no alignment: the kernel copies bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((len as usize).min(buf.len()))
}

/// `IP_RECVTOS` (ip(7)) and, on an IPv6 socket, `IPV6_RECVTCLASS` (ipv6(7)): each datagram
/// comes with the TOS byte or traffic class it arrived with, ECN bits included (`--ecn`: the
/// receiver counts CE and bleached marks). On an IPv6 socket both are asked: it may receive
/// IPv4 (v4-mapped) datagrams too.
pub(crate) fn enable_recv_tos(sock: &UdpSocket) -> io::Result<()> {
    let v4 = setsockopt(
        sock.as_fd(),
        libc::IPPROTO_IP,
        libc::IP_RECVTOS,
        1 as libc::c_int,
    );
    if sock.local_addr()?.is_ipv6() {
        setsockopt(
            sock.as_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVTCLASS,
            1 as libc::c_int,
        )
    } else {
        v4
    }
}

/// `UDP_GRO` (udp(7), Linux 5.0): the kernel may hand this socket several datagrams of one
/// flow in one buffer, with their size in a cmsg ([`Batch::segment_size`]).
pub(crate) fn enable_udp_gro(sock: &UdpSocket) -> io::Result<()> {
    setsockopt(sock.as_fd(), libc::SOL_UDP, libc::UDP_GRO, 1 as libc::c_int)
}

/// The CPUs this thread may run on (`sched_getaffinity(2)`), in ascending order.
pub(crate) fn allowed_cpus() -> io::Result<Vec<u32>> {
    // SAFETY: `cpu_set_t` is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed; 0 is this thread.
    let r = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = u32::try_from(libc::CPU_SETSIZE).unwrap_or(1024);
    // SAFETY: `set` was filled by the kernel above; `CPU_ISSET` reads a bit below CPU_SETSIZE.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &set) })
        .collect())
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity(2)`): `EINVAL` when none of them
/// is online and allowed (a CPU number past `CPU_SETSIZE` is refused the same way).
pub(crate) fn set_thread_cpus(cpus: &[u32]) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    for &c in cpus {
        if c as usize >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `c` is below CPU_SETSIZE (checked above); `set` is a valid `cpu_set_t`.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_BUSY_POLL` (socket(7)): the kernel polls the device's queue for `usecs` in a blocking
/// receive. Raising it above `net.core.busy_read` needs `CAP_NET_ADMIN` (`EPERM`).
pub(crate) fn set_busy_poll(fd: BorrowedFd<'_>, usecs: u32) -> io::Result<()> {
    let v = libc::c_int::try_from(usecs).unwrap_or(libc::c_int::MAX);
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, v)
}

/// An epoll instance (epoll(7)), level-triggered: the readiness loop of many-flow latency
/// tests (`latency::rr`), one per thread, with its event buffer.
pub(crate) struct Poller {
    epoll: std::os::fd::OwnedFd,
    events: Vec<libc::epoll_event>,
    ready: usize,
}

/// Whether this platform has [`Poller`].
pub(crate) const POLLER: bool = true;

/// Whether the kernel has `epoll_pwait2` (until a call says it has not).
static PWAIT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

impl Poller {
    /// A new epoll instance that reports up to `capacity` ready sockets per wait.
    pub(crate) fn new(capacity: usize) -> io::Result<Self> {
        // SAFETY: no pointers are passed; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nothing else.
        let epoll = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Self {
            epoll,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; capacity.max(1)],
            ready: 0,
        })
    }

    fn ctl(&self, op: i32, fd: BorrowedFd<'_>, token: u64, write: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | if write { libc::EPOLLOUT } else { 0 }) as u32,
            u64: token,
        };
        // SAFETY: both descriptors are valid for the call (`fd` is borrowed, the epoll owned),
        // and `ev` is a valid, writable `epoll_event` for its duration.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for reading (and writing, when `write`), reported as `token`.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, token: u64, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, write)
    }

    /// Changes whether `fd` is watched for writing too.
    pub(crate) fn modify(&self, fd: BorrowedFd<'_>, token: u64, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, write)
    }

    /// Stops watching `fd`.
    pub(crate) fn remove(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, false)
    }

    /// Waits up to `timeout` (zero: returns at once) for ready sockets; how many are ready
    /// ([`Poller::event`] reads them). An interrupted wait reports none.
    ///
    /// The timeout is kept to the nanosecond (`epoll_pwait2`, Linux 5.11), so that an open
    /// loop wakes for a send due in 50 µs; where the kernel lacks it, `epoll_wait` waits the
    /// timeout rounded up to the millisecond (a send then leaves up to 1 ms late, and is
    /// counted late beyond that).
    pub(crate) fn wait(&mut self, timeout: Duration) -> io::Result<usize> {
        let max = i32::try_from(self.events.len()).unwrap_or(i32::MAX);
        let n = if PWAIT2.load(std::sync::atomic::Ordering::Relaxed) {
            #[allow(
                clippy::unnecessary_fallible_conversions,
                reason = "c_long is 32 bits on some targets (the nanoseconds fit)"
            )]
            let ts = libc::timespec {
                tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::try_from(timeout.subsec_nanos()).unwrap_or(0),
            };
            // SAFETY: `events` is a valid, writable buffer of `max` `epoll_event`s and `ts` a
            // valid `timespec` for the call; the signal mask is null (unchanged), its size 0.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    self.epoll.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    max,
                    ptr::from_ref(&ts),
                    ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                PWAIT2.store(false, std::sync::atomic::Ordering::Relaxed);
                return self.wait(timeout);
            }
            i32::try_from(rc).unwrap_or(-1)
        } else {
            // Rounded up: a wait shorter than a millisecond is not a spin.
            let ms = i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX);
            // SAFETY: `events` is a valid, writable buffer of `max` `epoll_event`s for the call.
            unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), self.events.as_mut_ptr(), max, ms) }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            self.ready = 0;
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.ready = usize::try_from(n).unwrap_or(0);
        Ok(self.ready)
    }

    /// The `i`th ready socket of the last wait: its token, and whether it is readable (an
    /// error or hang-up counts: the read finds it) and writable.
    pub(crate) fn event(&self, i: usize) -> (u64, bool, bool) {
        let ev = self.events[i.min(self.ready.saturating_sub(1))];
        let bits = ev.events;
        let readable = bits & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        let writable = bits & (libc::EPOLLOUT | libc::EPOLLERR) as u32 != 0;
        ({ ev.u64 }, readable, writable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    /// A connected pair of loopback UDP sockets with a receive timeout.
    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let b = UdpSocket::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        (a, b)
    }

    /// Three 20-byte datagrams, each filled with its own index.
    fn three_datagrams() -> [u8; 60] {
        let mut buf = [0u8; 60];
        for (i, d) in buf.chunks_exact_mut(20).enumerate() {
            d.fill(i as u8);
        }
        buf
    }

    /// Receives the three datagrams with one or more `recvmmsg` calls into 32-byte slots.
    fn receive_three(rx: &UdpSocket) {
        let mut batch = Batch::new(8);
        let mut buf = [0xffu8; 8 * 32];
        let mut seen = 0;
        for _ in 0..3 {
            let n = batch.recv(rx, &mut buf, 32).unwrap();
            for (i, slot) in buf.chunks_exact(32).take(n).enumerate() {
                assert_eq!(batch.datagram_len(i), 20);
                assert_eq!(slot[..20], [seen as u8; 20]);
                seen += 1;
            }
            if seen == 3 {
                return;
            }
        }
        panic!("only {seen} of 3 datagrams arrived");
    }

    #[test]
    fn gso_send_arrives_as_separate_datagrams() {
        let (tx, rx) = pair();
        match send_segments(&tx, &three_datagrams(), 20) {
            Ok(sent) => assert_eq!(sent, 60),
            Err(e) if gso_refused(&e) => {
                eprintln!("no UDP GSO on this kernel ({e}): skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        receive_three(&rx);
    }

    #[test]
    fn sendmmsg_and_recvmmsg_move_a_batch() {
        let (tx, rx) = pair();
        let mut batch = Batch::new(8);
        assert_eq!(batch.capacity(), 8);
        assert_eq!(batch.send(&tx, &three_datagrams(), 20).unwrap(), 3);
        receive_three(&rx);
    }

    #[test]
    fn recvmmsg_truncates_to_the_slot_and_times_out_when_idle() {
        let (tx, rx) = pair();
        tx.send(&[7u8; 100]).unwrap();
        let mut batch = Batch::new(4);
        let mut buf = [0u8; 4 * 32];
        assert_eq!(batch.recv(&rx, &mut buf, 32).unwrap(), 1);
        assert_eq!(batch.datagram_len(0), 32);
        rx.set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        let err = batch.recv(&rx, &mut buf, 32).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn tcp_info_reports_no_retransmits_on_a_fresh_connection() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(tcp_total_retrans(&client), Some(0));
    }

    #[test]
    fn monotonic_ns_is_the_clock_instant_reads() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }

    /// Sends through `send` until a datagram or read comes back with a receive stamp: the
    /// kernel turns software receive stamping on for the whole host through a deferred static
    /// key, so what arrives in the first moments after the first socket asks may carry none.
    fn until_stamping_is_on(mut exchange: impl FnMut() -> Option<u64>) {
        for _ in 0..1_000 {
            if exchange().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no software receive timestamp within a second of enabling them");
    }

    #[test]
    fn udp_datagrams_carry_kernel_rx_and_tx_timestamps() {
        let (tx, rx) = pair();
        let mut buf = [0u8; 64];
        udp_enable_timestamps(&rx, false).unwrap();
        until_stamping_is_on(|| {
            tx.send(&[0xee; 8]).unwrap();
            udp_recv_stamped(&rx, &mut buf).unwrap().1
        });
        // Keys count from 0 when the option is set, whatever the socket sent before.
        udp_enable_timestamps(&tx, true).unwrap();
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        for i in 0..3u8 {
            tx.send(&[i; 40]).unwrap();
        }
        let mut rx_stamps = Vec::new();
        for i in 0..3u8 {
            let (n, stamp) = udp_recv_stamped(&rx, &mut buf).unwrap();
            assert_eq!((n, buf[0]), (40, i));
            rx_stamps.push(stamp.expect("a software RX timestamp on loopback"));
        }
        // Each TX stamp precedes its RX stamp.
        let mut keys = Vec::new();
        for _ in 0..100 {
            match read_tx_stamp(tx.as_fd()).unwrap() {
                Some((key, ns)) => {
                    assert!(ns >= before && ns <= rx_stamps[key as usize], "{key}: {ns}");
                    keys.push(key);
                }
                None if keys.len() == 3 => break,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(keys, [0, 1, 2]);
        assert_eq!(read_tx_stamp(tx.as_fd()).unwrap(), None);
        // Off again: this socket asks for no stamp (another socket of the host may still
        // keep stamping on, but it is not reported here).
        disable_timestamps(rx.as_fd());
        tx.send(&[9; 8]).unwrap();
        assert_eq!(udp_recv_stamped(&rx, &mut buf).unwrap(), (8, None));
    }

    #[test]
    fn tcp_reads_carry_kernel_rx_timestamps() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        tcp_enable_timestamps(&server, false).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut buf = [0u8; 16];
        until_stamping_is_on(|| {
            std::io::Write::write_all(&mut client, b"hello").unwrap();
            let (n, stamp) = tcp_recv_stamped(&server, &mut buf).unwrap();
            assert_eq!(&buf[..n], b"hello");
            stamp
        });
    }

    #[test]
    fn errors_are_classified_by_errno() {
        assert!(gso_refused(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!gso_refused(&io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
        assert!(batch_unsupported(&io::Error::from_raw_os_error(
            libc::ENOSYS
        )));
        assert!(no_buffer_space(&io::Error::from_raw_os_error(
            libc::ENOBUFS
        )));
        assert!(!no_buffer_space(&io::Error::from_raw_os_error(
            libc::EAGAIN
        )));
    }

    #[test]
    fn system_activity_reads_intr_and_ctxt_of_proc_stat() {
        // softirq is the `cpu` line's seventh number: 250 ticks, 2.5 s at USER_HZ 100.
        let stat = "cpu  10 0 20 300 0 7 250 0 0 0\n\
                    cpu0 10 0 20 300 0 7 250 0 0 0\n\
                    intr 123456 0 9 0 0\n\
                    ctxt 7890\n\
                    btime 1700000000\n";
        let activity = proc_stat_activity(stat);
        let hz = clock_ticks_per_second().unwrap();
        assert_eq!(activity.softirq_ns, Some(250 * 1_000_000_000 / hz));
        assert_eq!(activity.interrupts, Some(123_456));
        assert_eq!(activity.context_switches, Some(7_890));
        assert_eq!(
            activity.syscalls, None,
            "Linux counts no system calls host-wide"
        );
        assert_eq!(
            proc_stat_activity(""),
            crate::cpu::SystemActivity::default()
        );

        // This host's own counters move forward (the interrupt count includes the timer's).
        let before = system_activity();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let after = system_activity();
        let moved = after.since(&before);
        assert!(moved.context_switches.is_some_and(|n| n > 0), "{moved:?}");
        assert!(moved.interrupts.is_some(), "{moved:?}");
    }
}
