//! One place that says what a failed socket call means for the loop that made it.
//!
//! Every data loop in sonde (the ping loops and echoes, bulk send and receive, the agent's
//! sockperf and iperf3 loops, the control reads) asks these questions of an [`io::Error`] rather
//! than matching on its kind itself, so that "a timeout passed" or "the datagram was dropped"
//! means the same thing everywhere, on every platform:
//!
//! * [`again`]: nothing happened yet (the socket's timeout passed, or a signal interrupted the
//!   call); look at the stop flag and the deadlines, then call again;
//! * [`timed_out`]: the socket's timeout passed (without the signal case), for calls whose
//!   caller turns that into its own timeout;
//! * [`datagram_dropped`]: a UDP send the kernel could not queue (a full send buffer,
//!   `ENOBUFS`): the datagram is lost like any other and shows up as loss, not as an error;
//! * [`port_unreachable`]: an ICMP port unreachable about an earlier datagram (`ECONNREFUSED`
//!   on Linux, `WSAECONNRESET` on Windows);
//! * [`peer_gone`]: the TCP peer closed or reset the connection.
//!
//! The errno-level cases (`ENOBUFS`, the ICMP error) are the platform's: `sys` answers them.

use std::io;

use crate::sys;

/// A blocked call's timeout passed (`EAGAIN`/`WouldBlock` on Unix, `TimedOut` on Windows) or a
/// signal interrupted it: look at the flags and deadlines, then go again.
#[must_use]
pub fn again(e: &io::Error) -> bool {
    timed_out(e) || e.kind() == io::ErrorKind::Interrupted
}

/// A blocked call's timeout passed (`EAGAIN`/`WouldBlock` on Unix, `TimedOut` on Windows).
#[must_use]
pub fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A datagram send that failed only for now: the kernel could not queue it (`ENOBUFS`, a full
/// send buffer on a non-blocking socket) or a signal interrupted the call. The datagram is lost
/// like any other.
#[must_use]
pub fn datagram_dropped(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || sys::no_buffer_space(e)
}

/// An ICMP port unreachable about an earlier datagram on a connected UDP socket.
#[must_use]
pub fn port_unreachable(e: &io::Error) -> bool {
    sys::port_unreachable(e)
}

/// The TCP peer closed or reset the connection.
#[must_use]
pub fn peer_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_signals_are_transient_and_nothing_else_is() {
        use io::ErrorKind as K;
        for kind in [K::WouldBlock, K::TimedOut, K::Interrupted] {
            assert!(again(&kind.into()), "{kind:?}");
        }
        assert!(!timed_out(&K::Interrupted.into()));
        for kind in [
            K::ConnectionReset,
            K::BrokenPipe,
            K::UnexpectedEof,
            K::InvalidData,
        ] {
            assert!(!again(&kind.into()), "{kind:?}");
        }
        assert!(datagram_dropped(&K::WouldBlock.into()));
        assert!(!datagram_dropped(&K::TimedOut.into()));
        assert!(peer_gone(&K::ConnectionAborted.into()));
        assert!(!peer_gone(&K::WouldBlock.into()));
    }
}
