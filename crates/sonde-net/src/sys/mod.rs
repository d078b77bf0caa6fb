//! Platform code. Linux gets batching and GSO; Windows gets CPU times, USO where offered and a
//! host-wide clock (`windows.rs`); other platforms fall back to one datagram per call.
//!
//! Both implementations offer the same items, so the loops above never `cfg` on the platform:
//!
//! * [`send_segments`]: one UDP GSO send of consecutive equal-sized datagrams;
//! * [`Batch`]: reusable `sendmmsg`/`recvmmsg` vectors;
//! * [`tcp_total_retrans`]: `TCP_INFO` retransmits;
//! * the data-stream options of `socket::DataOptions` ([`set_tcp_congestion`] and its
//!   neighbours: `TCP_MAXSEG`, `IP_TOS`/`IPV6_TCLASS`, `SO_MAX_PACING_RATE`);
//! * error classification ([`gso_refused`], [`batch_unsupported`], [`no_buffer_space`]).
//!
//! Socket options socket2 does not offer go through one typed helper per platform: on Linux
//! `setsockopt` (an integer value) and `getsockopt` (into a byte buffer, returning the length
//! the kernel wrote, for `TCP_INFO`'s growing struct); on Windows `setsockopt` (a DWORD). They
//! are the only places the calls are made.
//!
//! Where a facility is missing the call fails with [`std::io::ErrorKind::Unsupported`] and the
//! classifiers say so, which sends the caller down its fallback path.

/// A socket borrowed for a call: its descriptor (`BorrowedFd`) on Unix, its handle
/// (`BorrowedSocket`) on Windows. The functions here that act on a socket's descriptor take
/// one, never a raw descriptor, so that the socket outlives the call.
#[cfg(unix)]
pub(crate) type SockRef<'a> = std::os::fd::BorrowedFd<'a>;
/// A socket borrowed for a call (see the Unix definition).
#[cfg(windows)]
pub(crate) type SockRef<'a> = std::os::windows::io::BorrowedSocket<'a>;

/// Borrows `s`'s descriptor (handle, on Windows) for the calls that take a [`SockRef`].
#[cfg(unix)]
pub(crate) fn sock_ref<S: std::os::fd::AsFd>(s: &S) -> SockRef<'_> {
    s.as_fd()
}
/// Borrows `s`'s descriptor (handle, on Windows) for the calls that take a [`SockRef`].
#[cfg(windows)]
pub(crate) fn sock_ref<S: std::os::windows::io::AsSocket>(s: &S) -> SockRef<'_> {
    s.as_socket()
}

#[cfg(target_os = "linux")]
// The workspace denies `unsafe_code`; this module is where sonde's FFI lives. (`expect`, as
// for `windows.rs`: the workspace's MSRV, 1.88, has it; a module left without unsafe code
// would then be flagged.)
#[expect(unsafe_code)]
mod linux;
#[cfg(target_os = "linux")]
pub(crate) use linux::*;

#[cfg(not(target_os = "linux"))]
// On Windows some of its items are replaced by `windows.rs`'s.
#[cfg_attr(windows, allow(dead_code))]
mod portable;
#[cfg(not(target_os = "linux"))]
pub(crate) use portable::*;

// Windows: the portable items, with those `windows.rs` defines in their place (a name imported
// by name shadows the same name from the glob).
#[cfg(windows)]
#[expect(unsafe_code)]
mod windows;
#[cfg(windows)]
pub(crate) use windows::{
    gso_refused, monotonic_ns, no_buffer_space, port_unreachable, rusage, send_segments,
    system_activity, MAX_GSO_BYTES, MAX_GSO_SEGMENTS,
};
