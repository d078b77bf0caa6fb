//! Control messages (`cmsg(3)`), built and parsed in one place: the `UDP_SEGMENT` size a GSO
//! send carries, and what a receive finds (the `UDP_GRO` segment size, `SCM_TIMESTAMPING`
//! stamps, `IP(V6)_RECVERR` entries of the error queue).
//!
//! The walk over a `msghdr`'s control buffer ([`Iter`]) and the write into one ([`Encoder`]) are
//! the only places that use the `CMSG_*` macros; the walk yields each header as a typed [`Cmsg`],
//! its data read only when the header says there is room for it.

use std::mem;
use std::ptr;

/// A control buffer of `N` words: `u64`s, so that the `cmsghdr`s inside are aligned.
pub(super) type Buf<const N: usize> = [u64; N];

/// `SO_TIMESTAMPING` (`SO_TIMESTAMPING_OLD`, whose `timespec` is the C library's) and the
/// control message that carries its stamps. The value is 37 on the architectures that use
/// `asm-generic/socket.h` (x86, Arm, RISC-V, s390, PowerPC, LoongArch); others get no stamps.
#[cfg(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "s390x",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "loongarch64"
))]
pub(super) const SO_TIMESTAMPING: libc::c_int = 37;
#[cfg(not(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "s390x",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "loongarch64"
)))]
pub(super) const SO_TIMESTAMPING: libc::c_int = -1;

/// One control message, as sonde reads it.
#[derive(Clone, Copy)]
pub(super) enum Cmsg {
    /// `SOL_UDP`/`UDP_GRO`: the size of each datagram the kernel coalesced into the buffer.
    GroSegment(libc::c_int),
    /// `SOL_SOCKET`/`SCM_TIMESTAMPING`: software, (deprecated), hardware stamps.
    Timestamping([libc::timespec; 3]),
    /// `SOL_IP`/`IP_RECVERR` or `SOL_IPV6`/`IPV6_RECVERR`: an error-queue entry, and the
    /// address that sent it (`SO_EE_OFFENDER`: the router of an ICMP error) when there is one.
    RecvErr(libc::sock_extended_err, Option<std::net::IpAddr>),
    /// `SOL_IP`/`IP_TOS` (a byte) or `SOL_IPV6`/`IPV6_TCLASS` (an int): the TOS byte or traffic
    /// class a datagram arrived with (`IP_RECVTOS`, `IPV6_RECVTCLASS`).
    Tos(u8),
    /// Anything else, or a known kind too short for its data.
    Other,
}

impl Cmsg {
    /// What `c` carries. Its data is read (unaligned, as the kernel packs it) only when
    /// `cmsg_len` covers a whole value. Only for headers [`Iter`] found: their `cmsg_len`
    /// bytes lie inside the control buffer.
    fn parse(c: &libc::cmsghdr) -> Cmsg {
        let (level, kind) = (c.cmsg_level, c.cmsg_type);
        if level == libc::SOL_UDP && kind == libc::UDP_GRO {
            data::<libc::c_int>(c).map_or(Cmsg::Other, Cmsg::GroSegment)
        } else if level == libc::SOL_SOCKET && kind == SO_TIMESTAMPING {
            data::<[libc::timespec; 3]>(c).map_or(Cmsg::Other, Cmsg::Timestamping)
        } else if (level == libc::SOL_IP && kind == libc::IP_RECVERR)
            || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR)
        {
            data::<libc::sock_extended_err>(c)
                .map_or(Cmsg::Other, |e| Cmsg::RecvErr(e, offender(c)))
        } else if level == libc::SOL_IP && kind == libc::IP_TOS {
            data::<u8>(c).map_or(Cmsg::Other, Cmsg::Tos)
        } else if level == libc::SOL_IPV6 && kind == libc::IPV6_TCLASS {
            // The traffic class is the low byte of the int.
            data::<libc::c_int>(c).map_or(Cmsg::Other, |t| Cmsg::Tos((t & 0xff) as u8))
        } else {
            Cmsg::Other
        }
    }
}

/// The `T` in `c`'s data, if `cmsg_len` says it holds one.
fn data<T: Copy>(c: &libc::cmsghdr) -> Option<T> {
    // SAFETY: CMSG_LEN is arithmetic on its argument.
    let header = unsafe { libc::CMSG_LEN(0) } as usize;
    // `size_t` in glibc, `socklen_t` in musl (the static build's target).
    #[allow(clippy::unnecessary_cast)]
    let len = (c.cmsg_len as usize).saturating_sub(header);
    if len < mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `c` is a header inside a control buffer (see `Iter`) whose `cmsg_len` bytes are
    // initialised; its data starts at CMSG_DATA and holds at least size_of::<T>() bytes
    // (checked above). T is a plain C value (`Copy`, every bit pattern valid for the types
    // used here), read unaligned.
    Some(unsafe { ptr::read_unaligned(libc::CMSG_DATA(c).cast::<T>()) })
}

/// `SO_EE_OFFENDER`: the address after an error-queue entry's `sock_extended_err`, as a
/// `sockaddr_in` or `sockaddr_in6` (family `AF_UNSPEC` when there is none).
fn offender(c: &libc::cmsghdr) -> Option<std::net::IpAddr> {
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct WithV4(libc::sock_extended_err, libc::sockaddr_in);
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct WithV6(libc::sock_extended_err, libc::sockaddr_in6);
    if let Some(WithV6(_, a)) = data::<WithV6>(c) {
        if libc::c_int::from(a.sin6_family) == libc::AF_INET6 {
            return Some(std::net::Ipv6Addr::from(a.sin6_addr.s6_addr).into());
        }
    }
    match data::<WithV4>(c) {
        Some(WithV4(_, a)) if libc::c_int::from(a.sin_family) == libc::AF_INET => {
            Some(std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into())
        }
        _ => None,
    }
}

/// The control messages a `recvmsg`/`recvmmsg` left in a `msghdr`, parsed.
pub(super) struct Iter<'a> {
    hdr: &'a libc::msghdr,
    next: *const libc::cmsghdr,
}

impl<'a> Iter<'a> {
    /// Walks `hdr`'s control buffer.
    ///
    /// # Safety
    /// `hdr` was filled by a successful `recvmsg`/`recvmmsg` (or has `msg_controllen` 0): its
    /// `msg_control` points at a live buffer, aligned for `cmsghdr`, of which the first
    /// `msg_controllen` bytes are initialised, and that buffer is not written while the
    /// iterator lives.
    pub(super) unsafe fn new(hdr: &'a libc::msghdr) -> Self {
        // SAFETY: per the contract, CMSG_FIRSTHDR reads within the control buffer (or returns
        // null when it is shorter than a header).
        let next = unsafe { libc::CMSG_FIRSTHDR(hdr) };
        Self { hdr, next }
    }
}

impl Iterator for Iter<'_> {
    type Item = Cmsg;

    fn next(&mut self) -> Option<Cmsg> {
        // SAFETY: `next` is null or a header CMSG_FIRSTHDR/CMSG_NXTHDR returned inside the
        // initialised control buffer `Iter::new` was given, which outlives 'a.
        let current = unsafe { self.next.as_ref() }?;
        // SAFETY: as above; CMSG_NXTHDR returns null past the end of `msg_controllen`.
        self.next = unsafe { libc::CMSG_NXTHDR(self.hdr, current) };
        Some(Cmsg::parse(current))
    }
}

/// Writes control messages into a `msghdr`'s control buffer, then sets its length.
pub(super) struct Encoder<'a> {
    hdr: &'a mut libc::msghdr,
    /// Where the next header goes (null once the buffer is full).
    next: *mut libc::cmsghdr,
    /// Bytes used so far (`CMSG_SPACE` of each message written).
    len: usize,
}

impl<'a> Encoder<'a> {
    /// Points `hdr` at `buf` (its whole length, until [`Encoder::finish`]) and starts at its
    /// first header. `buf` must outlive every use of `hdr`.
    pub(super) fn new<const N: usize>(hdr: &'a mut libc::msghdr, buf: &'a mut Buf<N>) -> Self {
        buf.fill(0);
        hdr.msg_control = buf.as_mut_ptr().cast();
        hdr.msg_controllen = mem::size_of_val(buf) as _;
        // SAFETY: msg_control points at `buf`: zeroed, writable, aligned for cmsghdr, and
        // msg_controllen bytes long, so CMSG_FIRSTHDR stays inside it (null if too short).
        let next = unsafe { libc::CMSG_FIRSTHDR(hdr) };
        Self { hdr, next, len: 0 }
    }

    /// Appends one control message carrying `value`.
    ///
    /// # Panics
    /// When the buffer has no room for it: the buffers are sized for what their callers send,
    /// so that is a bug.
    pub(super) fn push<T: Copy>(&mut self, level: libc::c_int, kind: libc::c_int, value: T) {
        // SAFETY: CMSG_SPACE and CMSG_LEN are arithmetic on their argument.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(mem::size_of::<T>() as u32) as usize,
                libc::CMSG_LEN(mem::size_of::<T>() as u32),
            )
        };
        // `size_t` in glibc, `socklen_t` in musl (the static build's target).
        #[allow(clippy::unnecessary_cast)]
        let room = (self.hdr.msg_controllen as usize).saturating_sub(self.len);
        assert!(
            !self.next.is_null() && space <= room,
            "control buffer too small"
        );
        // SAFETY: `next` is a non-null header position inside the zeroed control buffer with
        // `space` bytes left after it (checked above), so the header and its data fit; the data
        // is written unaligned, as the kernel reads it.
        unsafe {
            (*self.next).cmsg_level = level;
            (*self.next).cmsg_type = kind;
            (*self.next).cmsg_len = len as _;
            ptr::write_unaligned(libc::CMSG_DATA(self.next).cast::<T>(), value);
        }
        self.len += space;
        // SAFETY: `next` is a complete header inside the buffer; CMSG_NXTHDR returns the next
        // position inside `msg_controllen` bytes, or null.
        self.next = unsafe { libc::CMSG_NXTHDR(self.hdr, self.next) };
    }

    /// Sets the `msghdr`'s control length to what was written.
    pub(super) fn finish(self) {
        self.hdr.msg_controllen = self.len as _;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_encoded_is_parsed_back_and_short_ones_are_not_read() {
        // SAFETY: msghdr is a C struct of integers and raw pointers; all zeroes is valid.
        let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
        let mut buf: Buf<8> = [0; 8];
        let mut enc = Encoder::new(&mut hdr, &mut buf);
        let size: libc::c_int = 1200;
        enc.push(libc::SOL_UDP, libc::UDP_GRO, size);
        enc.push(libc::SOL_SOCKET, libc::SO_RCVBUF, 7u8);
        enc.finish();
        // SAFETY: `hdr` points at `buf`, initialised up to the length `finish` set.
        let found: Vec<Cmsg> = unsafe { Iter::new(&hdr) }.collect();
        assert_eq!(found.len(), 2);
        assert!(matches!(found[0], Cmsg::GroSegment(1200)));
        assert!(matches!(found[1], Cmsg::Other));

        // A GRO header whose length leaves no room for its int is not read.
        // SAFETY: as above, all zeroes is a valid msghdr.
        let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
        let mut buf: Buf<8> = [0; 8];
        let mut enc = Encoder::new(&mut hdr, &mut buf);
        enc.push(libc::SOL_UDP, libc::UDP_GRO, 0u8);
        enc.finish();
        // SAFETY: as above.
        let first = unsafe { Iter::new(&hdr) }.next();
        assert!(matches!(first, Some(Cmsg::Other)));
    }
}
